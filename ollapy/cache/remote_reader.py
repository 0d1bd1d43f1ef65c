"""The remote tier's bulk read: :class:`ReadAhead`, values received by pipelined ``GET`` s on a thread of its own.

A restore (:meth:`ollapy.cache.remote_tier.RemoteTier.fetch`) asks for a few hundred values in order; each
round trip carries :data:`ollapy.cache.remote.GET_CHUNK` of them. The reader thread starts at once (the caller
prepares its restore buffer meanwhile) and receives up to ``budget`` bytes ahead of the caller, who checks and
places the values already received: the socket's receive, the client's reply parsing and the CRC-32C check
release the GIL, so on two cores the transfer and the caller's work overlap. The budget bounds the memory a
read holds beyond what its caller took (one chunk may overshoot it: a chunk is never split). The thread never
outlives the read: :meth:`ReadAhead.close` (or the end of the values, or ``with``) stops and joins it.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

__all__ = ["ReadAhead"]


class ReadAhead:
    """Iterate the values of ``chunks`` (lists of keys, in order) as ``get_chunk(keys)`` returns them (a list
    of ``bytes | None``, or None when the store failed: the read ends there); a thread of this object calls it
    until the chunks end, ``time.monotonic()`` passes ``deadline``, ``available()`` is False or :meth:`close`.

    ``budget``: bytes received ahead of the caller before the thread waits for it to take them.
    """

    def __init__(self, chunks: list[list[str]], get_chunk: Callable[[list[str]], list | None], deadline: float,
                 available: Callable[[], bool], budget: int) -> None:
        assert budget > 0, budget
        self._chunks, self._get_chunk, self._deadline, self._available = chunks, get_chunk, deadline, available
        self.budget = budget
        self._cv = threading.Condition()
        self._ready: deque[list] = deque()  # chunks received, not yet taken
        self._held = 0  # their bytes
        self._done = not chunks  # the reader ended (no more chunks will come)
        self._stop = False
        self._chunk: list = []
        self._i = 0
        self._thread: threading.Thread | None = None
        if chunks:
            self._thread = threading.Thread(target=self._read, name="ollapy-remote-reader", daemon=True)
            self._thread.start()

    def _read(self) -> None:
        try:
            for keys in self._chunks:
                with self._cv:
                    while self._held >= self.budget and not self._stop:
                        self._cv.wait()
                    if self._stop:
                        return
                if time.monotonic() > self._deadline or not self._available():
                    return
                values = self._get_chunk(keys)
                if values is None:
                    return
                with self._cv:
                    self._ready.append(values)
                    self._held += sum(len(v) for v in values if v is not None)
                    self._cv.notify_all()
        finally:
            with self._cv:
                self._done = True
                self._cv.notify_all()

    def __iter__(self) -> Iterator[bytes | None]:
        return self

    def __next__(self) -> bytes | None:
        while self._i >= len(self._chunk):
            with self._cv:
                while not self._ready and not self._done:
                    self._cv.wait()
                if not self._ready:
                    chunk = None
                else:
                    chunk = self._ready.popleft()
                    self._held -= sum(len(v) for v in chunk if v is not None)
                    self._cv.notify_all()
            if chunk is None:
                self.close()
                raise StopIteration
            self._chunk, self._i = chunk, 0
        self._i += 1
        return self._chunk[self._i - 1]

    def close(self) -> None:
        """Stop the reader thread and join it (idempotent); values not taken are dropped."""
        with self._cv:
            self._stop = True
            self._ready.clear()
            self._held = 0
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._chunk = []

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
