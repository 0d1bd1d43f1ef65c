"""The parent's handles on things that live in a runner child: a pending call and a generation's Request (see
:mod:`ollapy.runner.process`). Nothing here imports llama_cpp."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ollapy.engine.request import Request
from ollapy.errors import RunnerError


def fresh_error(err: RunnerError) -> RunnerError:
    """A new RunnerError with ``err``'s words: each failed caller raises its own (tracebacks are per instance)."""
    return RunnerError(err.message, err.hint)


class PendingCall:
    """One call waiting for the child's answer (settled by the reader thread)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.set()

    def wait(self, timeout: float | None = None) -> Any:
        """The answer; raises the child's error, or TimeoutError past ``timeout`` s. Ctrl-C stays deliverable."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.done.wait(0.25):
            if end is not None and time.monotonic() >= end:
                raise TimeoutError("the model runner did not answer")
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class ProcessRequest(Request):
    """A Request whose engine runs in a runner child: :meth:`cancel` also tells the child."""

    runner: Any = field(default=None, repr=False, compare=False)

    def cancel(self) -> None:
        """Stop this request here and in the child (its slot is freed within one engine step there)."""
        first = not self.cancelled
        super().cancel()
        if first and self.runner is not None:
            self.runner._send_cancel(self.id)

    def finish_early(self) -> None:
        """End this request as finished, here and in the child (:meth:`Request.finish_early`)."""
        first = not self.wrapping_up
        super().finish_early()
        if first and self.runner is not None:
            self.runner._send_cancel(self.id, "finish")
