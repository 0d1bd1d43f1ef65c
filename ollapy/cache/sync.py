"""The prompt cache's sync thread: the file-system work behind the index, off the engine's loop thread.

One thread per bound cache (``ollapy-cache-sync``) runs, in order:

1. ``setup()`` once: hash the model file when its sha256 is neither given
   nor memoized (seconds for a large GGUF), then list the cache directory;
2. ``refresh()`` on request: list the directory, read the headers of files
   that are new, apply the difference to the in-memory index;
3. ``tick()`` after every wake-up, at least every :data:`TICK_S` seconds
   (the cache persists its counters there, at most once a second).

The engine thread only reads the in-memory index. Before it looks up a
prompt it calls :meth:`IndexSync.refresh_if_stale`: when the last refresh was
asked for more than :data:`REFRESH_EVERY_S` ago (or ten times the last
refresh's duration, whichever is longer: a slow disk is listed less often) it
asks for one, and waits for it at most :data:`REFRESH_WAIT_S`, and only when
the previous refresh took under :data:`FAST_REFRESH_S`. On a healthy disk a
refresh takes a millisecond or two, so a state that another process (a
replica, a previous ``ollapy run``) just wrote is found. While a refresh is
still running it never waits. So a disk that turns slow or hangs costs the
engine one bounded wait, after which no slot waits for it at all (the cache
answers from the index it has, refreshed in the background).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ollapy.cache")

REFRESH_EVERY_S = 0.1
REFRESH_WAIT_S = 0.25
FAST_REFRESH_S = 0.05
TICK_S = 1.0


class IndexSync:
    """The sync thread of one bound cache (module docstring); started at construction, ended by :meth:`close`.

    ``fresh``: the caller listed the directory just now (no refresh needed yet).
    ``setup``, ``refresh`` and ``tick`` run on the thread only; an exception
    in one is logged and never ends the thread. :attr:`ready` is set once
    ``setup`` returned (or raised).
    """

    def __init__(self, refresh: Callable[[], None], tick: Callable[[], None],
                 setup: Callable[[], None] | None = None, fresh: bool = False, name: str = "ollapy-cache-sync") -> None:
        self._refresh = refresh
        self._tick = tick
        self._setup = setup
        self._cv = threading.Condition()
        self._requested = 0  # refreshes asked for
        self._done = 0  # refreshes whose results are in the index
        self._last_request = time.monotonic() if fresh else float("-inf")  # fresh: the directory was just listed
        self._last_duration = 0.0  # seconds the last refresh took
        self._stop = False
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[[], None], what: str) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the cache's upkeep never fails serving
            log.debug("prompt cache %s failed", what, exc_info=True)

    def _run(self) -> None:
        if self._setup is not None:
            self._call(self._setup, "setup")
        self.ready.set()
        while True:
            with self._cv:
                if self._requested == self._done and not self._stop:
                    self._cv.wait(TICK_S)
                if self._stop:
                    return
                want = self._requested
            if want > self._done:
                t0 = time.monotonic()
                self._call(self._refresh, "refresh")
                with self._cv:
                    self._last_duration = time.monotonic() - t0
                    self._done = want
                    self._cv.notify_all()
            self._call(self._tick, "tick")

    def _ask(self) -> int:
        self._last_request = time.monotonic()
        self._requested += 1
        self._cv.notify_all()
        return self._requested

    def refresh_if_stale(self, every: float = REFRESH_EVERY_S, wait: float = REFRESH_WAIT_S) -> bool:
        """The engine's call: ask for a refresh when the index is older than ``every`` s (or ten refresh
        durations), and wait for it ``wait`` s at most when refreshes are fast (module docstring).

        Returns True when the index is as fresh as asked; False when a refresh
        is still running, was not waited for (slow disk), or the cache is not
        set up yet.
        """
        with self._cv:
            if not self.ready.is_set() or self._requested > self._done:
                return False
            if time.monotonic() - self._last_request < max(every, 10 * self._last_duration):
                return True
            ticket = self._ask()
            if self._last_duration >= FAST_REFRESH_S:
                return False
            return self._cv.wait_for(lambda: self._done >= ticket or self._stop, wait)

    def refresh_now(self, timeout: float) -> bool:
        """Ask for a refresh and wait for it (at most ``timeout`` s); for callers other than the engine thread."""
        if not self.ready.wait(timeout):
            return False
        with self._cv:
            ticket = self._ask()
            return self._cv.wait_for(lambda: self._done >= ticket or self._stop, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """End the thread (a refresh in progress finishes first; a hung disk is left to the daemon thread)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
