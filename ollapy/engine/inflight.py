"""The batch in ``llama_decode`` right now, and stopping it when every request in it was cancelled.

A cancel (an editor's abandoned completion, a client gone, Ctrl-C) is noticed by the engine at the start of its
next step; without more, the step in flight ran to its end first: a whole decode step, or a prefill chunk of
seconds on a CPU, for a request nobody reads, while the next keystroke's request waited for the slot.
:class:`InflightBatch` lets a cancelling thread stop that decode through the context's abort flag
(:mod:`ollapy.engine.backend.abort`), but only when no request in the batch still wants it: one live slot's
row in the batch keeps it running (its cancelled neighbours end at the next step as before).

Used by the engine's loop thread (:meth:`InflightBatch.decode`) and by any thread that cancels a request
(:meth:`InflightBatch.note_cancel`, each Request's ``on_cancel`` hook). One short lock orders them, so a flag set
for one batch can never stop the next.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from ollapy.engine.slot import Slot
from ollapy.errors import Cancelled, DecodeAborted, DecodeError


class Abortable(Protocol):
    """What :class:`InflightBatch` needs of an abort flag (backend.abort.AbortFlag)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...


class InflightBatch:
    """The slots whose rows are in the decode in flight (empty between decodes) and the context's ``flag``."""

    def __init__(self, flag: Abortable | None) -> None:
        self._flag = flag
        self._lock = threading.Lock()
        self._slots: tuple[Slot, ...] = ()

    def begin(self, slots: Sequence[Slot]) -> None:
        """A decode of ``slots``' rows starts (loop thread): the flag is cleared, or set at once when every one
        of them was already cancelled."""
        if self._flag is None:
            return
        with self._lock:
            self._slots = tuple(slots)
            self._flag.clear()
            if self._all_cancelled():
                self._flag.set()

    def end(self) -> None:
        """The decode returned (loop thread): nothing is in flight, the flag is clear for any other decode."""
        if self._flag is None:
            return
        with self._lock:
            self._slots = ()
            self._flag.clear()

    def note_cancel(self) -> None:
        """A request was cancelled (any thread): stop the decode in flight if no request in it is still wanted."""
        if self._flag is None:
            return
        with self._lock:
            if self._slots and self._all_cancelled():
                self._flag.set()

    def _all_cancelled(self) -> bool:
        return all(s.request is not None and s.request.cancelled for s in self._slots)


def cancelled_or(slot: Slot, exc: DecodeError) -> DecodeError | Cancelled:
    """The error ``slot``'s request ends with after its decode raised ``exc``: Cancelled (with the phase it was
    cancelled in) when the decode was stopped by :class:`InflightBatch`, else ``exc`` itself."""
    if not isinstance(exc, DecodeAborted):
        return exc
    slot.request.cancelled_in = slot.state.value
    return Cancelled("request cancelled")
