"""Prompt-cache counters, persisted across processes without a shared mutable file.

Each process rewrites its own ``<root>/stats/<pid>-<nonce>.json`` atomically
(at most once a second, from the cache's sync thread, never from the engine's;
and at exit). ``ollapy cache stats`` sums every file;
files of processes that are gone are folded into ``total.json`` under an
``O_EXCL`` lock file, so the directory stays small. Each file names its host:
a process counts as gone only when it ran on this host (replicas on other hosts
may share the directory over network storage; their pids mean nothing here).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ollapy.cache.tiers import pid_alive
from ollapy.fsutil import write_atomically

_HOST = socket.gethostname()

COUNTERS = ("hits_ram", "hits_disk", "misses", "refused", "tokens_reused", "stores", "skipped_stores",
            "bytes_stored", "bytes_written", "files_written", "corrupt", "blocks_written", "blocks_reused",
            "whole_states", "superseded", "continued", "dangling", "hits_remote", "remote_misses", "remote_corrupt",
            "remote_partial", "remote_gated", "remote_bytes_read", "remote_offered")


@dataclass(frozen=True)
class CacheStats:
    """A typed snapshot of one process's prompt-cache figures for one model.

    Counters (since the cache was bound): ``hits_ram``, ``hits_disk``,
    ``misses``, ``refused`` (states llama.cpp would not take), ``tokens_reused``,
    ``stores``/``bytes_stored`` (states saved to the RAM tier: what a
    write-everything policy would put on disk), ``skipped_stores`` (already
    covered), ``bytes_written``/``files_written`` (admitted to the disk tier),
    ``corrupt`` (files that failed a check), ``blocks_written`` (block files
    queued because the disk lacked them), ``blocks_reused`` (blocks an entry
    written to disk found there already), ``whole_states`` (states the splitter
    did not recognise, kept whole), ``superseded`` (states a longer save point of their
    chain replaced before they were written: :mod:`ollapy.cache.policy`), ``continued`` (RAM-only states dropped
    because the finished state of a request that continued from them took their role), ``dangling`` (entry files
    dropped at a restore because a block they name was gone). Gauges: ``ram_bytes``, ``ram_entries``,
    ``ram_pinned_bytes``, ``entries`` (known to this process), ``ram_blocks``
    and ``ram_block_bytes`` (the RAM tier's blocks), ``ram_shared_bytes``
    (blocks two or more entries hold), ``ram_logical_bytes`` (the RAM tier's
    entries as whole states: divided by ``ram_bytes``, the dedupe ratio),
    ``blocks_evicted`` (RAM blocks freed since the cache was bound),
    ``queued_bytes`` (held by the disk writer's queue), ``restore_buffer_bytes`` (the
    buffer block entries are joined into for a restore: kept, as large as the largest
    state joined, until the cache is closed).

    The remote tier (:mod:`ollapy.cache.remote_tier`; zero without ``OLLAPY_CACHE_REMOTE``): counters
    ``hits_remote``, ``remote_misses`` (a stored entry that could not serve: evicted, failed a check, the store
    failed), ``remote_corrupt`` (values that failed a check), ``remote_partial`` (restores of a verified prefix
    of a chain), ``remote_gated`` (stored entries the cost gate left: prefilling was cheaper),
    ``remote_bytes_read``, ``remote_offered`` (entries queued for the store); gauges of the store client:
    ``remote_bytes_written``, ``remote_errors``, ``remote_dropped`` (queued writes dropped), ``remote_queue_depth``
    and ``remote_queue_bytes`` (writes waiting), ``remote_breaker_open`` (1 while the circuit breaker skips the
    store), ``remote_probe_us`` (the last lookup round trip, µs), ``remote_bandwidth`` (measured GET bytes/s).
    """

    hits_ram: int = 0
    hits_disk: int = 0
    misses: int = 0
    refused: int = 0
    tokens_reused: int = 0
    stores: int = 0
    skipped_stores: int = 0
    bytes_stored: int = 0
    bytes_written: int = 0
    files_written: int = 0
    corrupt: int = 0
    ram_bytes: int = 0
    ram_entries: int = 0
    ram_pinned_bytes: int = 0
    entries: int = 0
    blocks_written: int = 0
    blocks_reused: int = 0
    whole_states: int = 0
    superseded: int = 0
    continued: int = 0
    dangling: int = 0
    ram_blocks: int = 0
    ram_block_bytes: int = 0
    ram_shared_bytes: int = 0
    ram_logical_bytes: int = 0
    blocks_evicted: int = 0
    queued_bytes: int = 0
    restore_buffer_bytes: int = 0
    hits_remote: int = 0
    remote_misses: int = 0
    remote_corrupt: int = 0
    remote_partial: int = 0
    remote_gated: int = 0
    remote_bytes_read: int = 0
    remote_offered: int = 0
    remote_bytes_written: int = 0
    remote_errors: int = 0
    remote_dropped: int = 0
    remote_queue_depth: int = 0
    remote_queue_bytes: int = 0
    remote_breaker_open: int = 0
    remote_probe_us: int = 0
    remote_bandwidth: int = 0

    @property
    def dedupe_ratio(self) -> float:
        """The RAM tier's entries as whole states over the bytes it holds (1.0 when empty)."""
        return self.ram_logical_bytes / self.ram_bytes if self.ram_bytes else 1.0

    def as_dict(self) -> dict[str, int]:
        """Field name -> value."""
        return asdict(self)
LOCK_STALE_S = 60.0


def _write_json(path: Path, data: dict) -> None:
    write_atomically(path, lambda f: f.write(json.dumps(data).encode()), suffix=".json")


SAVE_EVERY_S = 1.0


class Stats:
    """This process's counters; :meth:`add` is cheap (memory only), :meth:`save` persists them."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.c = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self._last_save = 0.0
        self._dirty = False
        self._file = None
        if root is not None:
            self._file = root / "stats" / f"{os.getpid()}-{os.urandom(3).hex()}.json"

    def add(self, **kw: int) -> None:
        """Increase counters, in memory only (no file I/O: the engine thread calls this)."""
        with self._lock:
            for k, v in kw.items():
                self.c[k] = self.c.get(k, 0) + v
            self._dirty = True

    def save_if_due(self, every: float = SAVE_EVERY_S) -> None:
        """:meth:`save` when there is something new and the last save is over ``every`` seconds old."""
        if self._dirty and time.monotonic() - self._last_save > every:
            self.save()

    def snapshot(self, **gauges: int) -> CacheStats:
        """The counters now, plus ``gauges``, as a :class:`CacheStats`."""
        with self._lock:
            counters = {k: int(self.c.get(k, 0)) for k in COUNTERS}
        return CacheStats(**counters, **gauges)

    def save(self) -> None:
        """Write this process's counters now (errors ignored)."""
        if self._file is None or not self._dirty:
            return
        with self._lock:
            data = dict(self.c, pid=os.getpid(), host=_HOST)
            self._dirty = False
        self._last_save = time.monotonic()
        try:
            _write_json(self._file, data)
        except OSError:
            pass


def aggregate(root: Path, compact: bool = True) -> dict:
    """Sum the counters of every process (past and present) that used ``root``."""
    d = root / "stats"
    total = dict.fromkeys(COUNTERS, 0)
    try:
        files = [p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith(".tmp-")]
    except OSError:
        return total
    locked = False
    lock = d / ".lock"
    if compact:
        try:
            if lock.exists() and time.time() - lock.stat().st_mtime > LOCK_STALE_S:
                lock.unlink()
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            locked = True
        except OSError:
            locked = False
    try:
        folded = dict.fromkeys(COUNTERS, 0)
        dead: list[Path] = []
        for p in files:
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            for k in COUNTERS:
                v = int(data.get(k, 0) or 0)
                total[k] += v
                if p.name == "total.json":
                    folded[k] += v
            pid = data.get("pid")
            here = data.get("host", _HOST) == _HOST
            if locked and p.name != "total.json" and isinstance(pid, int) and here and not pid_alive(pid):
                for k in COUNTERS:
                    folded[k] += int(data.get(k, 0) or 0)
                dead.append(p)
        if locked and dead:
            _write_json(d / "total.json", folded)
            for p in dead:
                try:
                    p.unlink()
                except OSError:
                    pass
    finally:
        if locked:
            try:
                lock.unlink()
            except OSError:
                pass
    return total


def reset(root: Path) -> None:
    """Delete every stats file under ``root``."""
    d = root / "stats"
    try:
        for p in d.iterdir():
            try:
                p.unlink()
            except OSError:
                pass
    except OSError:
        pass
