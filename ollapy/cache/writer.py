"""The prompt cache's background disk writer, with an explicit lifecycle.

A :class:`CacheWriter` runs one thread that takes jobs (write a state file,
delete an entry's files) from a queue, in order. While a model is serving, the
thread runs at idle CPU priority so it never takes a core from llama.cpp's
decode threads; :meth:`CacheWriter.close` raises it back to normal priority and
waits for the queue to drain, bounded in time.

Lifecycle (the order :meth:`ollapy.engine.model.LoadedModel.close` uses):

1. the engine loop is stopped and joined, so no new jobs arrive;
2. :meth:`CacheWriter.close` drains the queue (normal priority, bounded wait:
   it waits on a condition, it does not poll), then stops the thread;
3. on a timeout or Ctrl-C it aborts the write in progress, removes this
   process's own temporary files and reports how many states were not saved.

Process-wide: :data:`_BUSY` holds a strong reference to every writer that has
queued work, and :func:`drain_all` (called by the CLI's entry point and the
server's shutdown, never left to garbage collection or ``atexit`` order)
closes them all. A writer is removed from it when its queue is empty.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ollapy.cache.tempfiles import writer_prefix

log = logging.getLogger("ollapy.cache")

QUEUE_BYTES = 1 << 30  # default byte budget of a writer's queue
_BUSY: set[CacheWriter] = set()
_BUSY_LOCK = threading.Lock()


def set_thread_priority(tid: int, idle: bool) -> None:
    """Put thread ``tid`` in Linux SCHED_IDLE (``idle``) or back in SCHED_OTHER; nice 19/0 elsewhere.

    llama.cpp's CPU threads wait for each other at spin barriers, so a busy
    extra thread that preempts one of them stalls the whole decode step: while
    a model serves, the writer must never take a core from them. At shutdown
    nothing decodes, and an idle-priority thread on a CPU that other processes
    keep busy would never finish: the drain runs at normal priority.
    """
    try:
        policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
        os.sched_setscheduler(tid, policy, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19 if idle else 0)
    except (AttributeError, OSError):
        pass


@dataclass
class DrainResult:
    """What a drain left behind: ``unsaved`` states dropped (timeout or Ctrl-C), ``removed`` temp files deleted."""

    unsaved: int = 0
    removed: int = 0
    interrupted: bool = False

    def __iadd__(self, other: DrainResult) -> DrainResult:
        self.unsaved += other.unsaved
        self.removed += other.removed
        self.interrupted = self.interrupted or other.interrupted
        return self


class Aborted(Exception):
    """Raised inside a job when its writer was told to stop mid-write."""


class CacheWriter:
    """One ordered job queue and the thread that runs it.

    Jobs are callables ``job(abort_check)``; a write job calls
    ``abort_check()`` between chunks, which raises :class:`Aborted` once the
    writer is closing after a timeout or Ctrl-C. ``counts_as_state`` marks
    jobs whose loss is reported as an unsaved state. The queue is bounded in
    bytes (``budget``, default :data:`QUEUE_BYTES`): a job declares the bytes it
    holds (``nbytes``) and one that would take the queue past its budget is
    refused, so after the RAM tier let go of a state the writer never holds
    more than its budget. Write jobs name their
    temporary files with ``tmp_prefix`` (unique to this writer:
    :func:`~ollapy.cache.tempfiles.writer_prefix`); ``tmp_dirs`` lists the
    directories where an aborted write may leave one. Giving up removes only
    this writer's temporary files, never those of another writer sharing
    the directory (two model names on one GGUF file).
    """

    def __init__(self, name: str = "ollapy-cache-writer", budget: int | None = None) -> None:
        self.name = name
        self.budget = QUEUE_BYTES if budget is None else budget
        self.queued_bytes = 0  # bytes the queued and running jobs hold
        self.refused = 0  # jobs refused because they did not fit the budget
        self._jobs: collections.deque[tuple[Callable, bool, int]] = collections.deque()
        self._cv = threading.Condition()
        self._running = 0  # jobs taken but not finished (0 or 1)
        self._running_state = False
        self._closing = False
        self._closed = False
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._tid: int | None = None
        self.tmp_dirs: set[Path] = set()
        self.tmp_prefix = writer_prefix()
        self.written = 0
        self.last_result = DrainResult()

    # ---- producer side -----------------------------------------------------------------------
    def submit(self, job: Callable[[Callable[[], None]], None], counts_as_state: bool = True, nbytes: int = 0) -> bool:
        """Queue ``job``, which holds ``nbytes`` until it ran; False (job dropped) when the writer is already
        closed or the job would take the queue past its byte budget."""
        with self._cv:
            if self._closing:
                return False
            if nbytes and self.queued_bytes + nbytes > self.budget:
                self.refused += 1
                log.debug("prompt cache writer: %d bytes queued, %d more refused (budget %d)",
                          self.queued_bytes, nbytes, self.budget)
                return False
            self.queued_bytes += nbytes
            self._jobs.append((job, counts_as_state, nbytes))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cv.notify_all()
        with _BUSY_LOCK:
            _BUSY.add(self)
        return True

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cv:
            return len(self._jobs) + self._running

    # ---- the thread --------------------------------------------------------------------------
    def _check_abort(self) -> None:
        if self._abort.is_set():
            raise Aborted()

    def _run(self) -> None:
        with self._cv:  # under the lock: close() either sees the tid and raises the priority, or we see closing
            self._tid = threading.get_native_id()
            if not self._closing:
                set_thread_priority(self._tid, idle=True)
        while True:
            with self._cv:
                while not self._jobs and not self._closing:
                    self._cv.wait()
                if not self._jobs or self._abort.is_set():
                    self._jobs.clear()
                    self.queued_bytes = 0
                    self._cv.notify_all()
                    if self._closing:
                        return
                    continue
                job, self._running_state, held = self._jobs.popleft()
                self._running = 1
            try:
                job(self._check_abort)
                self.written += 1
            except Aborted:
                pass
            except Exception:  # noqa: BLE001 - a cache write never fails anything else
                log.debug("prompt cache job failed", exc_info=True)
            finally:
                del job  # let go of the bytes it held before counting them free
                with self._cv:
                    self.queued_bytes = max(0, self.queued_bytes - held)
                    self._running = 0
                    self._cv.notify_all()
                    empty = not self._jobs
                if empty:
                    with _BUSY_LOCK:
                        _BUSY.discard(self)

    # ---- lifecycle ---------------------------------------------------------------------------
    def flush(self, timeout: float) -> bool:
        """Wait (on the queue's condition) until every job queued so far ran; True when drained in time."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._jobs or self._running:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 120.0) -> DrainResult:
        """Drain at normal priority (at most ``timeout`` s), then stop the thread; idempotent.

        On a timeout, or a KeyboardInterrupt while waiting, the write in
        progress is aborted, queued states are dropped, this process's
        temporary files are removed and the result says how many states were
        not saved; KeyboardInterrupt is then re-raised.
        """
        with self._cv:
            if self._closed:
                return self.last_result
            self._closed = self._closing = True
            self._cv.notify_all()
            thread = self._thread
            if thread is not None and self._tid is not None:
                set_thread_priority(self._tid, idle=False)
        if thread is None:
            with _BUSY_LOCK:
                _BUSY.discard(self)
            return self.last_result
        try:
            drained = self.flush(timeout)
        except KeyboardInterrupt:
            res = self._abandon()
            res.interrupted = True
            raise_after = True
        else:
            raise_after = False
            res = DrainResult() if drained else self._abandon()
        thread.join(timeout=5.0)
        with _BUSY_LOCK:
            _BUSY.discard(self)
        self.last_result = res
        if raise_after:
            raise KeyboardInterrupt
        return res

    def _abandon(self) -> DrainResult:
        """Abort the running write, drop the queue, delete our temporary files."""
        with self._cv:
            queued = sum(1 for _, is_state, _ in self._jobs if is_state)
            running = bool(self._running and self._running_state)
            written = self.written
            self._abort.set()
            self._jobs.clear()
            self.queued_bytes = 0
            self._cv.notify_all()
        t = self._thread
        if t is not None:
            t.join(timeout=5.0)  # an aborted write stops at its next chunk (8 MiB)
        if running and self.written > written:
            running = False  # it passed its last chunk check and was renamed into place after all
        return DrainResult(unsaved=queued + running, removed=remove_temp_files(self.tmp_dirs, self.tmp_prefix))


def remove_temp_files(dirs, prefix: str) -> int:
    """Delete the files named ``prefix*`` (one writer's temporary files) in ``dirs``; returns how many."""
    n = 0
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join(d, name))
                    n += 1
                except OSError:
                    pass
    return n


def drain_all(timeout: float = 120.0) -> DrainResult:
    """Close every writer that still has work (the process-wide shutdown step); returns the sum.

    Normally a no-op: each model closes its own cache. It catches writers
    whose owner was never closed. KeyboardInterrupt propagates after every
    writer was abandoned cleanly.
    """
    total = DrainResult()
    with _BUSY_LOCK:
        writers = list(_BUSY)
    end = time.monotonic() + timeout
    interrupted = False
    for w in writers:
        try:
            total += w.close(max(0.0, end - time.monotonic()) if not interrupted else 0.0)
        except KeyboardInterrupt:
            interrupted = True
            total += w.last_result
    if interrupted:
        total.interrupted = True
    return total


def busy_writers() -> int:
    """How many writers hold queued work now (for tests and diagnostics)."""
    with _BUSY_LOCK:
        return len(_BUSY)
