"""The runner child's output as the parent sees it: logged again, with a short tail kept for error messages.

The child writes its Python log records to stderr as ``LEVEL logger: message`` lines
(:data:`ollapy.runner.child.LOG_FORMAT`) and ggml writes whatever it writes (an abort line such as
``/build/.../ggml-rpc.cpp:566: GGML_ASSERT(...) failed``). :class:`ChildLog` reads that stream on a thread of its
own: records are logged again at their level under their logger, other lines at debug; warnings and other lines
go to a tail, whose :meth:`ChildLog.last_line` names a dead child's cause.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
from typing import IO

log = logging.getLogger("ollapy.runner")

_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): (.*)$")
_SOURCE_DIR = re.compile(r"^/\S*/(?=[\w.+-]+:\d+: )")  # the directory of a "FILE:LINE: message" line


class ChildLog:
    """Reads ``stream`` (the child's stdout+stderr, bytes) on a daemon thread until end of file."""

    def __init__(self, stream: IO[bytes], name: str, pid: int) -> None:
        self.name, self.pid = name, pid
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self._stream = stream
        self._thread = threading.Thread(target=self._read, name=f"runner-stderr-{pid}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in iter(self._stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            m = _RECORD.match(line)
            if m:
                level = logging.getLevelName(m.group(1))
                logging.getLogger(m.group(2)).log(level, "%s", m.group(3))
                if level >= logging.WARNING:
                    self.tail.append(m.group(3))
            else:
                log.debug("runner %s [%d]: %s", self.name, self.pid, line)
                self.tail.append(line)
        self._stream.close()

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until the child's output is closed and read: the tail is complete then."""
        self._thread.join(timeout=timeout)

    def last_line(self) -> str:
        """The last meaningful line the child printed (ggml's abort line, a Python error), trimmed to 300
        characters, its source directory dropped (``ggml-rpc.cpp:566: ...``); ``""`` when there is none."""
        for line in reversed(self.tail):
            text = line.strip()
            if text and not text.startswith(("Traceback", "File ", "^")):
                text = _SOURCE_DIR.sub("", text)
                return text if len(text) <= 300 else text[:299] + "…"
        return ""
