"""The prompt-cache facade the engine talks to: :class:`PromptCache` and :class:`BoundCache`.

``open_prompt_cache(ref, options)`` returns a :class:`PromptCache`;
``LoadedModel`` calls :meth:`PromptCache.bind` once its backend exists, and the
engine calls the :class:`BoundCache` methods from its loop thread only:
``peek`` (best candidate, nothing read yet), ``load`` (read and verify it),
``record_hit``/``record_refused``/``record_miss`` and ``store``. Disk writes
happen on a :class:`~ollapy.cache.writer.CacheWriter` thread; the model sha256
is computed (or read from its on-disk memo) on a thread started at bind time.

Disk admission (what reaches the shared disk tier):

* ``store(..., persist=True)``: prefixes that later requests start with (the
  end of a system prompt, the end of the previous chat turn) and pinned
  states are written through at once.
* ``persist=False``: the whole state a finished request leaves (its one-off
  question and answer) stays in the RAM tier. It reaches disk only on
  evidence of reuse: a later request restores at least one block more of it
  than any persisted entry offers (a conversation that continues). A cache
  bound with ``write_back=True`` (the CLI: one process per answer) also
  writes its most recently used RAM-only entry when it is closed, so the
  next process can continue that conversation.

Lifecycle: :meth:`BoundCache.close` (called by ``LoadedModel.close`` after the
engine loop was joined) writes back, drains the writer at normal priority
with a bounded wait and returns a :class:`~ollapy.cache.writer.DrainResult`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import config
from .fileformat import PayloadCheck
from .index import BlockIndex, HashFn, blake2_chain
from .salt import file_sha256, normalize_digest, salt_from_backend, salt_key
from .stats import CacheStats, Stats
from .tiers import LAYOUT, DiskTier, Entry, RamTier, delete_entry_files
from .writer import DrainResult

log = logging.getLogger("ollapy.cache")

BLOCK = 64
WRITE_BACK_NEWEST = 1  # RAM-only states a write_back cache writes when closed: the most recently used one


@dataclass
class Candidate:
    """The best saved prefix for a prompt, before anything is read: ``n_tokens`` verified shared tokens."""

    entry: Entry
    n_tokens: int
    tier: str  # "ram" or "disk"

    @property
    def nbytes(self) -> int:
        """Size of the state a restore moves."""
        return self.entry.nbytes


@dataclass
class Hit:
    """A verified prefix match: restore ``load()`` (state of all ``tokens``), then trim to ``n_tokens``."""

    n_tokens: int
    tokens: list[int]
    tier: str
    entry: Entry
    payload: object
    check: PayloadCheck | None = None

    def load(self):
        """The state payload (checksum-verified, or being verified: see :meth:`verified`)."""
        return self.payload

    def verified(self) -> bool:
        """True when the payload's checksum matched (waits for a deferred check; RAM payloads are trusted)."""
        return self.check is None or self.check.ok()


class PromptCache:
    """An unbound prompt cache for one model reference and its load options.

    ``write_back`` True (the CLI) writes RAM-only entries to disk at
    :meth:`BoundCache.close`; a server leaves them in RAM (see the module
    docstring for the admission rule).
    """

    def __init__(self, ref, options=None, *, root: Path | None = None, ram_bytes: int | None = None,
                 disk_bytes: int | None = None, block: int = BLOCK, hash_fn: HashFn = blake2_chain,
                 write_back: bool = False) -> None:
        self.ref = ref
        self.options = options
        self.root = Path(root) if root is not None else config.cache_dir()
        self.ram_bytes = config.cache_ram_bytes() if ram_bytes is None else ram_bytes
        self.disk_bytes = config.cache_disk_bytes() if disk_bytes is None else disk_bytes
        self.block = block
        self.hash_fn = hash_fn
        self.write_back = write_back

    def bind(self, loaded_model) -> BoundCache:
        """Attach to a loaded model (its backend gives the KV settings)."""
        path = Path(getattr(loaded_model, "path", None) or self.ref.path)
        digest = normalize_digest(getattr(loaded_model, "digest", None)) or normalize_digest(getattr(self.ref, "digest", None))
        name = getattr(loaded_model, "name", None) or getattr(self.ref, "name", None) or path.name
        bound = BoundCache(self, path, digest, salt_from_backend(loaded_model.backend), name)
        bound.piece = getattr(loaded_model.backend, "token_piece", None)
        # llama.cpp saves only the in-window cells of sliding-window layers (llama_kv_cache::state_write
        # skips SWA-masked cells), so such a state restores correctly only as a whole: never trimmed.
        bound.trimmable = int(getattr(loaded_model.backend, "n_swa", 0) or 0) == 0
        return bound


class BoundCache:
    """The prompt cache of one loaded model. Engine-facing methods run on its loop thread only.

    A context manager: leaving the ``with`` block calls :meth:`close`.
    """

    def __init__(self, parent: PromptCache, model_path: Path, digest: str | None, salt: dict, model_name: str) -> None:
        self.parent = parent
        self.root = parent.root
        self.block = parent.block
        self.salt = salt
        self.model_name = model_name
        self.model_path = model_path
        self.write_back = parent.write_back
        self.piece: Callable[[int], bytes] | None = None
        self.trimmable = True
        self.stats = Stats(self.root)
        self.ram = RamTier(parent.ram_bytes)
        self._sha: str | None = digest
        self._sha_thread: threading.Thread | None = None
        self._ready_done = False
        self.index: BlockIndex | None = None
        self.disk: DiskTier | None = None
        self.entries: dict[str, Entry] = {}
        self._lock = threading.RLock()
        self._closed = False
        self.last_drain = DrainResult()
        if self._sha is None:
            self._sha_thread = threading.Thread(target=self._hash_model, name="ollapy-cache-sha", daemon=True)
            self._sha_thread.start()

    def __enter__(self) -> BoundCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- setup -----------------------------------------------------------------------------
    def _hash_model(self) -> None:
        try:
            self._sha = file_sha256(self.model_path, self.root)
        except OSError as exc:
            log.debug("prompt cache: cannot hash %s: %s", self.model_path, exc)

    def _ready(self) -> bool:
        if self._ready_done:
            return self.index is not None
        if self._sha_thread is not None:
            self._sha_thread.join()
        self._ready_done = True
        if not self._sha:
            return False
        skey = salt_key(self.salt)
        directory = self.root / LAYOUT / f"{self._sha[:16]}-{skey}"
        seed = hashlib.blake2b((self._sha + json.dumps(self.salt, sort_keys=True)).encode(), digest_size=16).digest()
        self.index = BlockIndex(seed, self.block, self.parent.hash_fn)
        self.disk = DiskTier(self.root, directory, self._sha, self.salt, self.model_name, self.parent.disk_bytes)
        return True

    @property
    def model_sha256(self) -> str | None:
        """The model file's sha256 (waits for the background hash)."""
        self._ready()
        return self._sha

    @property
    def directory(self) -> Path | None:
        """This model's disk directory."""
        return self.disk.dir if self._ready() else None

    def _name(self, tokens: list[int]) -> str:
        from array import array

        h = hashlib.blake2b(self.index.salt + array("i", tokens).tobytes(), digest_size=16)
        return h.hexdigest()

    def _refresh(self) -> None:
        """Sync the index with the disk directory: new files in, vanished files out."""
        listing = self.disk.listing()
        for name, e in list(self.entries.items()):
            if name not in listing and e.on_disk and not e.pending:
                e.on_disk = False
                if e.payload is None:
                    self._forget(e)
        for name, (path, mtime, pinned) in listing.items():
            e = self.entries.get(name)
            if e is None:
                e = self.disk.open_entry(name, path)
                if e is None:
                    continue
                self.entries[name] = e
                self.index.add(e)
            e.on_disk = True
            e.path = path
            e.pinned = e.pinned or pinned
            e.last_used = max(e.last_used, mtime) if e.payload is not None else mtime

    def _forget(self, e: Entry) -> None:
        self.entries.pop(e.name, None)
        if self.index is not None:
            self.index.remove(e)
        self.ram.drop(e)

    # ---- engine API ------------------------------------------------------------------------
    def peek(self, tokens: list[int], max_tokens: int | None = None, exclude: set[str] = frozenset()
             ) -> Candidate | None:
        """The saved state sharing the longest verified prefix with ``tokens`` (≥ one block), or None.

        Reads no payload. Entries longer than ``max_tokens`` (the slot's
        ``num_ctx``: llama.cpp would refuse them), entries refused earlier in
        this process and names in ``exclude`` are skipped, not deleted.
        """
        if len(tokens) < self.block or self._closed or not self._ready():
            return None
        with self._lock:
            self._refresh()

            def usable(x: Entry) -> bool:
                if x.refused or x.name in exclude:
                    return False
                if max_tokens is not None and len(x.tokens) > max_tokens:
                    return False
                if x.payload is None and not x.on_disk:
                    return False
                # a sliding-window state must be used whole, as a strict prefix of the prompt
                return self.trimmable or len(x.tokens) < len(tokens)

            tried: set[int] = set()
            while True:
                e, n = self.index.best(tokens, accept=lambda x: id(x) not in tried and usable(x))
                if e is None:
                    return None
                tried.add(id(e))
                if not self.trimmable and n != len(e.tokens):
                    continue
                return Candidate(e, n, "ram" if e.payload is not None else "disk")

    def load(self, cand: Candidate, defer_check: bool = False) -> Hit | None:
        """Read and verify ``cand``'s state; None (corrupt files deleted and counted) when it fails.

        ``defer_check``: a disk payload's checksum runs on its own thread while
        the engine restores it; the engine then calls :meth:`Hit.verified` and,
        on False, :meth:`record_corrupt`.
        """
        e = cand.entry
        with self._lock:
            if e.payload is not None:
                return Hit(cand.n_tokens, list(e.tokens), "ram", e, e.payload)
            if not e.on_disk or e.path is None:
                return None
            data = self.disk.load(e, defer_check=defer_check)
            if data is None:
                self.stats.add(corrupt=1)
                self._forget(e)
                return None
            if defer_check:
                return Hit(cand.n_tokens, list(e.tokens), "disk", e, data[0], data[1])
            return Hit(cand.n_tokens, list(e.tokens), "disk", e, data)

    def record_corrupt(self, hit: Hit) -> None:
        """A deferred checksum failed after the engine restored ``hit``: the file is deleted, counted as corrupt."""
        e = hit.entry
        log.debug("prompt cache: dropping %s: payload checksum mismatch", e.path.name if e.path else e.name)
        with self._lock:
            if e.path is not None:
                delete_entry_files(e.path)
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

    def record_hit(self, hit: Hit) -> None:
        """The engine restored ``hit``: count it, mark the entry used, keep it in RAM, promote it on reuse."""
        e = hit.entry
        e.hits += 1
        e.last_used = time.time()
        if hit.tier == "disk":
            self.stats.add(hits_disk=1, tokens_reused=hit.n_tokens)
            if e.payload is None and e.name in self.entries:
                self.ram.put(e, hit.payload)
        else:
            self.stats.add(hits_ram=1, tokens_reused=hit.n_tokens)
        if e.on_disk:
            self.disk.touch(e)
        elif not e.pending and e.payload is not None:
            self._maybe_promote(e, hit.n_tokens)
        hit.payload = None

    def _maybe_promote(self, e: Entry, n_used: int) -> None:
        """Write a RAM-only entry to disk when it served at least a block more than persisted entries offer."""
        with self._lock:
            _, n_disk = self.index.best(e.tokens[:n_used], accept=lambda x: x.persisted and x is not e and (
                self.trimmable or len(x.tokens) <= n_used))  # an untrimmable state serves only whole
            if n_used - n_disk < self.block:
                return
            log.debug("prompt cache: promoting %s (%d tokens reused, %d on disk) to disk", e.name, n_used, n_disk)
            self._persist(e, e.payload, self._replaced_by(e.tokens, True, e.pinned))

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

    def _replaced_by(self, tokens: list[int], persist: bool, pinned: bool = False) -> list[Entry]:
        """Entries a new state of ``tokens`` makes redundant: strict prefixes that are no more durable than it.

        A queued write of a replaced entry is skipped (``superseded``); its file,
        if any, is deleted after the new state is written (same writer queue).
        """
        if not self.trimmable:
            return []
        return [r for r in self.index.covered_by(tokens)
                if (pinned or not r.pinned) and (persist or not r.persisted)]

    def _covering(self, tokens: list[int]) -> list[Entry]:
        """Entries that can serve ``tokens`` whole: longer ones too when states can be trimmed.

        States of sliding-window models cannot be trimmed (llama.cpp keeps only
        in-window SWA cells), so for them only an entry of exactly ``tokens`` counts.
        """
        covering = self.index.covering(tokens)
        if not self.trimmable:
            covering = [e for e in covering if len(e.tokens) == len(tokens)]
        return covering

    def store(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool = False,
              persist: bool = False) -> None:
        """Save the state of ``tokens`` (``get_state`` is called now; a disk write happens later).

        ``persist`` (or ``pinned``) writes through to disk; otherwise the
        state stays in RAM until reuse proves it worth a file (module docstring).
        """
        if len(tokens) < self.block or self._closed or not self._ready():
            return
        tokens = list(tokens)
        persist = persist or pinned
        with self._lock:
            covering = self._covering(tokens)
            if persist:
                covering = [e for e in covering if e.persisted]
            covering = [e for e in covering if e.persisted or e.payload is not None]
            if covering:
                if pinned:
                    for e in covering:
                        if not e.pinned:
                            self.disk.set_pin(e, True)
                            break
                self.stats.add(skipped_stores=1)
                return
            payload = get_state()
            if not payload:
                return
            e = Entry(name=self._name(tokens), tokens=tokens, nbytes=len(payload), pinned=pinned,
                      preview=self._preview(tokens))
            old = self.entries.get(e.name)
            if old is not None:
                self._forget(old)
            replaced = self._replaced_by(tokens, persist, pinned)
            for r in replaced:
                r.superseded = True
                self._forget(r)
            self.entries[e.name] = e
            self.index.add(e)
            for dropped in self.ram.put(e, payload):
                if not dropped.persisted:
                    self._forget(dropped)
            self.stats.add(stores=1, bytes_stored=len(payload))
            if persist:
                self._persist(e, payload, replaced)
            elif e.payload is None:  # larger than the RAM tier and not worth a file: nothing kept
                self._forget(e)

    def _persist(self, e: Entry, payload, replaced: list[Entry]) -> None:
        if self.disk.write_async(e, payload, replaced):
            self.stats.add(bytes_written=len(payload), files_written=1)

    def _preview(self, tokens: list[int]) -> str:
        if self.piece is None:
            return ""
        try:
            raw = b"".join(self.piece(t) for t in tokens[:48])
            return " ".join(raw.decode("utf-8", "replace").split())[:120]
        except Exception:  # noqa: BLE001 - a preview is cosmetic
            return ""

    # ---- maintenance -----------------------------------------------------------------------
    def flush(self, timeout: float = 60.0) -> bool:
        """Wait for queued disk writes; persist the stats."""
        ok = True
        if self.disk is not None:
            ok = self.disk.flush(timeout)
        self.stats.save()
        return ok

    def write_back_now(self, newest: int | None = None) -> int:
        """Queue disk writes of RAM-only entries that no persisted entry covers; returns how many.

        ``newest``: only the ``newest`` most recently used such entries (``close``
        writes back :data:`WRITE_BACK_NEWEST`: the conversation a next process
        may continue, not every one-off answer of an ``--each-line`` batch);
        None writes them all.
        """
        if self.disk is None:
            return 0
        n = 0
        with self._lock:
            todo = [e for e in self.entries.values()
                    if not (e.persisted or e.payload is None or e.superseded)
                    and not any(c.persisted for c in self._covering(e.tokens) if c is not e)]
            if newest is not None:
                todo = sorted(todo, key=lambda x: x.last_used, reverse=True)[:newest]
            for e in sorted(todo, key=lambda x: len(x.tokens), reverse=True):
                if e.superseded:  # replaced by a longer one written just now
                    continue
                replaced = self._replaced_by(e.tokens, True, e.pinned)
                for r in replaced:
                    r.superseded = True
                    self._forget(r)
                self._persist(e, e.payload, replaced)
                n += 1
        return n

    def snapshot(self) -> CacheStats:
        """This process's counters and the bytes it holds now (RAM tier read under its lock)."""
        with self._lock:
            ram_bytes = self.ram.bytes
            ram_entries = len(self.ram.entries)
            pinned = self.ram.pinned_bytes()
            entries = len(self.entries)
        return self.stats.snapshot(ram_bytes=ram_bytes, ram_entries=ram_entries, ram_pinned_bytes=pinned,
                                   entries=entries)

    def info(self) -> dict:
        """Entries and bytes of this model's cache as this process sees it (a dict of :meth:`snapshot`)."""
        out = self.snapshot().as_dict()
        out["directory"] = str(self.disk.dir) if self.disk is not None else None
        return out

    def close(self, timeout: float = 120.0) -> DrainResult:
        """Write back (``write_back`` caches), drain the writer (at most ``timeout`` s), drop the RAM tier.

        Idempotent. Returns what could not be saved (also kept as
        ``last_drain``); a KeyboardInterrupt while draining removes this
        process's temporary files, sets ``last_drain`` and propagates.
        """
        if self._closed:
            return self.last_drain
        self._closed = True
        try:
            if self.disk is not None:
                if self.write_back:
                    self.write_back_now(newest=WRITE_BACK_NEWEST)
                try:
                    self.last_drain = self.disk.close(timeout)
                except KeyboardInterrupt:
                    self.last_drain = self.disk.writer.last_result
                    raise
        finally:
            self.stats.save()
            with self._lock:
                for e in list(self.ram.entries.values()):
                    self.ram.drop(e)
        if self.last_drain.unsaved:
            log.debug("prompt cache: %d state(s) not saved", self.last_drain.unsaved)
        return self.last_drain


def open_prompt_cache(ref, options=None, *, write_back: bool = False) -> PromptCache | None:
    """The prompt cache for ``ref`` with load ``options``; None when ``OLLAPY_CACHE=0``."""
    if not config.cache_enabled():
        return None
    return PromptCache(ref, options, write_back=write_back)
