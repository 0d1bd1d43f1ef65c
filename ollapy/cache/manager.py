"""The prompt-cache facade the engine talks to: :class:`BoundCache`.

``open_prompt_cache(ref, options)`` returns a :class:`~ollapy.cache.prompt_cache.PromptCache`
(:mod:`ollapy.cache.prompt_cache`); ``LoadedModel`` calls its ``bind`` once its
backend exists, which returns a :class:`BoundCache`. The bound cache is the
engine's :class:`~ollapy.engine.prefix.source.PrefixSource`:
the engine calls ``peek`` (best candidate, nothing read yet), ``load`` (read
and verify it), ``record_hit``/``record_refused``/``record_corrupt``/``record_miss``
and ``store`` from its loop thread only.

Saved states go into a block pool (:mod:`ollapy.cache.blocks`): a state that
:mod:`ollapy.cache.kvstate` can cut becomes an entry of block names plus a
tail, its blocks held once in RAM and on disk however many entries share
them; a state it cannot cut is kept whole, as before. A restore joins the
chain back into llama.cpp's bytes (:meth:`BoundCache.load`).

This module keeps the entries, the block index and the two tiers in sync (the
store path is :class:`~ollapy.cache.intake.StateIntake`'s, the index's sync
with the directory :class:`~ollapy.cache.catalog.EntryCatalog`'s: both are
bases of :class:`BoundCache`); *what* is worth keeping and writing is decided by
:class:`~ollapy.cache.policy.AdmissionPolicy` (the rules are in
:mod:`ollapy.cache.policy`).

Threads: the engine's loop thread does no file-system work here other than
reading a chosen state (``load``) and rare clean-ups of files that failed a
check. Directory listings, header reads of new files, hashing a model file
whose sha256 is neither known nor memoized, and persisting the counters run
on the cache's sync thread (:mod:`ollapy.cache.sync`); disk writes and hit
marks run on the :class:`~ollapy.cache.writer.CacheWriter` thread. Until the
model's sha256 is known the cache offers nothing and keeps what the engine
stores in memory (at most the RAM tier's bytes); it is indexed, and written
where the policy says so, once the sha256 arrives. Entries, index and RAM
tier are read and changed under one lock, never held across a directory
listing, a payload read, copying a state out of llama.cpp (``get_state``) or
joining blocks: ``snapshot()`` (``/api/ps``, ``/metrics``) never waits on those.

Lifecycle: :meth:`BoundCache.close` (called by ``LoadedModel.close`` after the
engine loop was joined) waits for the model's sha256, writes back, drains the
writer at normal priority with a bounded wait and returns a
:class:`~ollapy.cache.writer.DrainResult`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ollapy.cache.candidate import Candidate, Hit
from ollapy.cache.catalog import EntryCatalog
from ollapy.cache.filemap import populated
from ollapy.cache.index import BlockIndex, common_prefix
from ollapy.cache.intake import StateIntake
from ollapy.cache.policy import WRITE_BACK_NEWEST, AdmissionPolicy
from ollapy.cache.remote_link import RemoteLink
from ollapy.cache.remote_tier import RemoteTier
from ollapy.cache.salt import file_sha256, memoized_sha256
from ollapy.cache.stats import CacheStats, Stats
from ollapy.cache.sync import IndexSync
from ollapy.cache.tiers import DanglingEntry, DiskTier, Entry, Parts, RamTier
from ollapy.cache.writer import DrainResult

if TYPE_CHECKING:
    from ollapy.cache.prompt_cache import PromptCache

log = logging.getLogger("ollapy.cache")

BLOCK = 64


__all__ = ["BLOCK", "WRITE_BACK_NEWEST", "BoundCache", "Candidate", "Hit"]


class BoundCache(StateIntake, EntryCatalog, RemoteLink):
    """The prompt cache of one loaded model; satisfies :class:`ollapy.engine.prefix.source.PrefixSource`.

    Engine-facing methods run on its loop thread only. A context manager:
    leaving the ``with`` block calls :meth:`close`.
    """

    def __init__(self, parent: PromptCache, model_path: Path, digest: str | None, salt: dict, model_name: str, *,
                 trimmable: bool = True, piece: Callable[[int], bytes] | None = None, segments: bool = False) -> None:
        """``segments``: the backend restores a state given as memory pieces (``Backend.restores_segments``), so
        a block entry is handed over as its pieces (:mod:`ollapy.cache.kvsegments`) instead of being joined."""
        self.parent = parent
        self.root = parent.root
        self.block = parent.block
        self.salt = salt
        self.model_name = model_name
        self.model_path = model_path
        self.write_back = parent.write_back
        self.write_delay = parent.write_delay
        self.piece = piece
        self.block_tokens = parent.block_tokens if parent.splitter is not None else 0
        self.kv = parent.splitter
        self.segments = segments and hasattr(self.kv, "join_segments")
        self.policy = AdmissionPolicy(self.block, trimmable)
        self.stats = Stats(self.root)
        self._lock = threading.RLock()
        self.ram = RamTier(parent.ram_bytes, lock=self._lock, before_evict=self._write_deferred)
        self.index: BlockIndex | None = None
        self.disk: DiskTier | None = None
        self.entries: dict[str, Entry] = {}
        self._early: list[tuple[list[int], object, bool, bool]] = []  # stores before the sha256 was known
        self._restore_buf = None  # the buffer block entries are joined into (see _join)
        self._closed = False
        self._offered: OrderedDict[str, None] = OrderedDict()  # entries queued for the remote tier
        self.last_drain = DrainResult()
        self.remote: RemoteTier | None = None
        self._sha: str | None = digest or memoized_sha256(model_path, self.root)
        if self._sha:  # known: index the directory now (load time), not at the first request
            self._setup()
            self._open_remote()
        self._sync = IndexSync(self._refresh, self._tick, setup=None if self._sha else self._hash_and_setup,
                               fresh=self.index is not None)

    def __enter__(self) -> BoundCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tick(self) -> None:
        """The sync thread's upkeep, about once a second: deferred writes that are due, the counters' file."""
        self.write_due()
        self.stats.save_if_due()

    @property
    def trimmable(self) -> bool:
        """False for sliding-window models: their states serve only whole."""
        return self.policy.trimmable

    @trimmable.setter
    def trimmable(self, value: bool) -> None:
        self.policy = AdmissionPolicy(self.block, value)

    # ---- setup and index sync (the sync thread, or load time) --------------------------------
    def _hash_and_setup(self) -> None:
        try:
            self._sha = file_sha256(self.model_path, self.root)
        except OSError as exc:
            log.debug("prompt cache: cannot hash %s: %s", self.model_path, exc)
            with self._lock:
                self._early.clear()
            return
        self._setup()
        self._open_remote()

    def _ready(self) -> bool:
        """True once the index exists (never waits: the engine thread calls it)."""
        return self.index is not None

    def _wait_ready(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the model's sha256 and the first listing; for callers off the engine thread."""
        self._sync.ready.wait(timeout)
        return self.index is not None

    @property
    def model_sha256(self) -> str | None:
        """The model file's sha256 (waits for the background hash)."""
        self._wait_ready()
        return self._sha

    @property
    def directory(self) -> Path | None:
        """This model's disk directory (waits for the background hash)."""
        return self.disk.dir if self._wait_ready() else None

    def _forget(self, e: Entry) -> None:
        self.entries.pop(e.name, None)
        if self.index is not None:
            self.index.remove(e)
        self.ram.drop(e)

    def _ram_put(self, e: Entry, payload, blocks=None) -> None:
        """Hold ``e``'s payload (and blocks) in the RAM tier; entries it evicts that exist nowhere else are forgotten."""
        for dropped in self.ram.put(e, payload, blocks):
            if not dropped.persisted:
                self._forget(dropped)

    # ---- engine API ------------------------------------------------------------------------
    def peek(self, tokens: list[int], max_tokens: int | None = None, exclude: set[str] = frozenset()
             ) -> Candidate | None:
        """The saved state sharing the longest verified prefix with ``tokens`` (≥ one block), or None.

        Reads no payload and no directory: the index is kept in sync by the
        sync thread (a bounded wait at most, :mod:`ollapy.cache.sync`). Of
        equally long matches the smallest state wins, then a RAM one. Entries
        longer than ``max_tokens`` (the slot's ``num_ctx``: llama.cpp would
        refuse them), entries refused earlier in this process and names in
        ``exclude`` are skipped, not deleted: a caller that cannot use the
        candidate (the planner found it too many bytes for its tokens) asks
        again with its name excluded and gets the next shorter prefix.
        """
        if len(tokens) < self.block or self._closed or not self._ready():
            return None
        self._sync.refresh_if_stale()
        best: Candidate | None = None
        best_key = None
        with self._lock:
            for e in self.index.candidates(tokens):
                if e.refused or e.name in exclude or (max_tokens is not None and len(e.tokens) > max_tokens):
                    continue
                if e.payload is None and not e.on_disk:
                    continue
                n = common_prefix(e.tokens, tokens)
                # a sliding-window state must be used whole, as a strict prefix of the prompt
                if n < self.block or not (self.trimmable or n == len(e.tokens) < len(tokens)):
                    continue
                key = (n, -e.nbytes, e.payload is not None)
                if best_key is None or key > best_key:
                    best, best_key = Candidate(e, n, "ram" if e.payload is not None else "disk"), key
        return self._peek_remote(tokens, best, max_tokens, exclude) if self.remote is not None else best

    def load(self, cand: Candidate, defer_check: bool = False) -> Hit | None:
        """Read and verify ``cand``'s state; None (corrupt files deleted and counted) when it fails.

        ``defer_check``: a disk payload's checksum runs on its own thread while
        the engine restores it; the engine then calls :meth:`Hit.verified` and,
        on False, :meth:`record_corrupt`.
        """
        e = cand.entry
        if cand.tier == "remote":
            return self._load_remote(cand)
        with self._lock:
            if e.payload is not None:
                if not e.blocks:
                    return Hit(cand.n_tokens, list(e.tokens), "ram", e, e.payload)
                blocks, tail = self.ram.blocks_of(e), e.payload
            elif not e.on_disk or e.path is None:
                return None
            else:
                blocks = tail = None
        if blocks is not None:  # joined outside the lock: the references keep the blocks alive
            state = self._join(e, blocks, tail)
            return None if state is None else Hit(cand.n_tokens, list(e.tokens), "ram", e, state, n_blocks=len(blocks))
        try:
            data = self.disk.load(e, defer_check=defer_check)  # outside the lock: /api/ps never waits on a disk read
        except DanglingEntry:  # a missing block is a miss, not corruption; the entry naming it was dropped
            with self._lock:
                self.stats.add(misses=1, dangling=1)
                self._forget(e)
            return None
        if data is None:
            with self._lock:
                if e.blocks:  # a block that failed its header check: counted where it failed
                    self.stats.add(misses=1)
                else:
                    self.stats.add(corrupt=1)
                self._forget(e)
            return None
        if isinstance(data, Parts):
            state = self._join(e, data.blocks, data.tail)
            if state is None:
                return None
            return Hit(cand.n_tokens, list(e.tokens), "disk", e, state, data.check, data.header, parts=data,
                       n_blocks=len(data.blocks))
        if defer_check:
            view, check, header = data
            return Hit(cand.n_tokens, list(e.tokens), "disk", e, view, check, header)
        return Hit(cand.n_tokens, list(e.tokens), "disk", e, data)

    def _join(self, e: Entry, blocks, tail):
        """``e``'s state joined from its blocks and tail; None (the entry forgotten) when they do not fit together.

        The state is joined into this cache's restore buffer (the engine thread restores one state at a
        time and llama.cpp copies it out before the next load): an anonymous mapping populated in one call
        (``MAP_POPULATE``) and reused while it is large enough, so a restore does not fault in a fresh
        buffer page by page. Without ``join_into`` (another splitter) a new buffer is joined. Where the
        backend reads pieces (``segments``), nothing is joined: the state's pieces are returned
        (:func:`ollapy.cache.kvsegments.join_segments`), pointing into the blocks and the tail.
        """
        try:
            if self.segments:
                return self.kv.join_segments(blocks, tail)
            if not hasattr(self.kv, "join_into"):
                return self.kv.join_state(blocks, tail)
            buf = self._restore_buffer(self.kv.joined_size(tail))
            n = self.kv.join_into(blocks, tail, buf)
            return memoryview(buf)[:n]
        except ValueError as exc:  # kvstate.KVStateError
            log.debug("prompt cache: entry %s does not join: %s", e.name, exc)
            with self._lock:
                self.stats.add(corrupt=1)
                self._forget(e)
            return None

    def _restore_buffer(self, size: int):
        """The restore buffer (see :meth:`_join`), at least ``size`` bytes: reused while it is large enough."""
        buf = self._restore_buf
        if buf is None or len(buf) < size:
            self._restore_buf = buf = populated(size)
        return buf

    def record_corrupt(self, hit: Hit) -> None:
        """A deferred checksum failed after the engine restored ``hit``: counted as corrupt; the file is deleted
        unless another process rewrote it since it was mapped."""
        e = hit.entry
        if hit.parts is not None:
            self.disk.condemn_parts(e, hit.parts)
        elif hit.header is not None:
            self.disk.condemn(e, hit.header, "payload checksum mismatch")
        with self._lock:
            self.stats.add(corrupt=1, misses=1)
            self._forget(e)
        hit.payload = None

    def lookup(self, tokens: list[int], max_tokens: int | None = None) -> Hit | None:
        """:meth:`peek` then :meth:`load`, trying the next candidate when a file fails its checks."""
        bad: set[str] = set()
        while True:
            cand = self.peek(tokens, max_tokens, exclude=bad)
            if cand is None:
                return None
            hit = self.load(cand)
            if hit is not None:
                return hit
            bad.add(cand.entry.name)

    def record_hit(self, hit: Hit, promote: bool = True, n_used: int | None = None) -> None:
        """The engine restored ``hit``: count it, mark the entry used, keep it in RAM, promote it on reuse
        (``promote`` False: the request writes a longer state of this prefix at a save point itself).
        ``n_used``: the tokens the request keeps of it (``tokens_reused`` counts these, as the request's
        ``prompt_cache_tokens`` does; None: ``hit.n_tokens``)."""
        e = hit.entry
        used = hit.n_tokens if n_used is None else min(n_used, hit.n_tokens)
        with self._lock:
            e.hits += 1
            e.last_used = time.time()
            if used == len(e.tokens):
                e.continued = "restore"
            if hit.tier == "remote":
                self.stats.add(hits_remote=1, tokens_reused=used)
            elif hit.tier == "disk":
                self.stats.add(hits_disk=1, tokens_reused=used)
                if e.payload is None and self.entries.get(e.name) is e:
                    if hit.parts is not None:
                        self._ram_put(e, hit.parts.tail, hit.parts.blocks)
                    else:
                        self._ram_put(e, hit.payload)
            else:
                self.stats.add(hits_ram=1, tokens_reused=used)
            on_disk = e.on_disk
            if promote and not e.persisted and e.payload is not None \
                    and self.policy.worth_promoting(self.index, e, hit.n_tokens):
                log.debug("prompt cache: promoting %s (%d tokens reused) to disk", e.name, hit.n_tokens)
                self._promote(e)
        if on_disk:  # mtime (LRU) and the .hit sidecar, on the writer thread
            self.disk.writer.submit(lambda _check: self.disk.touch(e), counts_as_state=False)
        hit.payload = None

    def record_reuse(self, tokens: list[int], n_tokens: int, promote: bool = True) -> None:
        """A slot served ``tokens[:n_tokens]`` from its own KV: the RAM-only entry sharing most of that prefix
        is marked used and promoted to disk when the policy says it is worth it (as :meth:`record_hit` does)
        and ``promote`` is True.

        With answer reuse a continuing conversation never passes its previous turn's save point (the slot
        holds the answer too), so this is how the finished turn's state reaches the disk."""
        with self._lock:
            e, n = self.index.best(tokens[:n_tokens], accept=lambda x: not x.on_disk and x.payload is not None)
            if e is None:
                return
            e.last_used = time.time()
            if n == len(e.tokens) and not e.continued:
                e.continued = "slot"
            if not promote or e.persisted or self.entries.get(e.name) is not e \
                    or not self.policy.worth_promoting(self.index, e, n):
                return
            log.debug("prompt cache: promoting %s (%d tokens reused by a slot) to disk", e.name, n)
            self._promote(e)

    def _promote(self, e: Entry) -> None:
        """Write RAM-only ``e`` that proved worth a file (under the lock). On a model whose states serve only whole
        it becomes an interim save point of its conversation (write-behind: :mod:`ollapy.cache.policy`), so the
        next turn's longer one replaces it unwritten."""
        if not self.policy.trimmable:
            e.interim = True
            e.due = time.monotonic() + self.write_delay
            return
        self._persist(e, e.payload, self._replaced(e, True))

    def record_refused(self, hit: Hit) -> None:
        """llama.cpp refused the state (it returns 0 when a state cannot fit): a miss; the entry is kept.

        The file may be valid for another process (a larger ``num_ctx``): it is
        only skipped in this one. Files are deleted only when a check fails.
        """
        log.debug("prompt cache: llama.cpp refused state %s (%d tokens); skipping it", hit.entry.name, len(hit.tokens))
        self.stats.add(refused=1, misses=1)
        hit.entry.refused = True
        hit.payload = None

    def record_miss(self) -> None:
        """Nothing usable was found."""
        self.stats.add(misses=1)

    # ---- maintenance -----------------------------------------------------------------------
    def refresh(self, timeout: float = 30.0) -> bool:
        """Sync the index with the directory now (waits for the sync thread, at most ``timeout`` s)."""
        return self._sync.refresh_now(timeout)

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait (at most ``timeout`` s) for the model's sha256, queue the deferred writes (:meth:`write_due`), wait
        for the queued disk writes; persist the stats."""
        ok = self._wait_ready(timeout)
        if self.disk is not None:
            self.write_due(everything=True)
            ok = self.disk.flush(timeout) and ok
        self.stats.save()
        return ok

    def snapshot(self) -> CacheStats:
        """This process's counters and the bytes it holds now (RAM tier read under its lock)."""
        with self._lock:  # held only for short bookkeeping: never across a state copy, a join or a disk read
            ram = self.ram
            gauges = dict(ram_bytes=ram.bytes, ram_entries=len(ram.entries), ram_pinned_bytes=ram.pinned_bytes(),
                          entries=len(self.entries), ram_blocks=len(ram.pool), ram_block_bytes=ram.pool.bytes,
                          ram_shared_bytes=ram.pool.shared_bytes(), ram_logical_bytes=ram.logical_bytes(),
                          blocks_evicted=ram.blocks_evicted,
                          queued_bytes=self.disk.writer.queued_bytes if self.disk is not None else 0,
                          restore_buffer_bytes=len(self._restore_buf) if self._restore_buf is not None else 0)
        if self.remote is not None:
            gauges.update(self.remote.snapshot())
        return self.stats.snapshot(**gauges)

    def info(self) -> dict:
        """Entries and bytes of this model's cache as this process sees it (a dict of :meth:`snapshot`)."""
        out = self.snapshot().as_dict()
        out["directory"] = str(self.disk.dir) if self.disk is not None else None
        out["remote"] = self.parent.store.url if self.parent.store is not None else None  # redacted
        return out

    def close(self, timeout: float = 120.0) -> DrainResult:
        """Wait for the sha256 (at most ``timeout`` s), write back (``write_back`` caches), drain the writer,
        drop the RAM tier.

        Idempotent. Returns what could not be saved (also kept as
        ``last_drain``); a KeyboardInterrupt while draining removes this
        cache's temporary files, sets ``last_drain`` and propagates.
        """
        if self._closed:
            return self.last_drain
        self._closed = True
        try:
            self._wait_ready(timeout)
            self._sync.close()
            if self.disk is not None:
                self.write_due(everything=True)
                if self.write_back:
                    self.write_back_now(newest=WRITE_BACK_NEWEST)
                try:
                    self.last_drain = self.disk.close(timeout)
                except KeyboardInterrupt:
                    self.last_drain = self.disk.writer.last_result
                    raise
        finally:
            if self.parent.store is not None:  # what is queued for the store goes out (bounded), then it closes
                self.parent.store.close()
            self.stats.save()
            with self._lock:
                for e in list(self.ram.entries.values()):
                    self.ram.drop(e)
                self._early.clear()
                self._restore_buf = None
        if self.last_drain.unsaved:
            log.debug("prompt cache: %d state(s) not saved", self.last_drain.unsaved)
        return self.last_drain
