"""The prompt-cache facade the engine talks to: :class:`PromptCache` and :class:`BoundCache`.

``open_prompt_cache(ref, options)`` returns a :class:`PromptCache`;
``LoadedModel`` calls :meth:`PromptCache.bind` once its backend exists, and the
engine calls the :class:`BoundCache` methods from its loop thread only:
``lookup``, ``record_hit``/``record_refused``/``record_miss`` and ``store``.
Disk writes happen on a background thread; the model sha256 is computed (or
read from its on-disk memo) on a thread started at bind time.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import config
from .index import BlockIndex, HashFn, blake2_chain
from .salt import file_sha256, normalize_digest, salt_from_backend, salt_key
from .stats import Stats
from .tiers import LAYOUT, DiskTier, Entry, RamTier

log = logging.getLogger("ollapy.cache")

BLOCK = 64
_LIVE: weakref.WeakSet[BoundCache] = weakref.WeakSet()


def _flush_all() -> None:  # pragma: no cover - exercised by subprocess tests
    for c in list(_LIVE):
        try:
            c.flush(timeout=120)
        except KeyboardInterrupt:  # Ctrl-C while saving at exit: unsaved states are dropped, none half-written
            return
        except Exception:
            log.debug("prompt cache flush at exit failed", exc_info=True)


atexit.register(_flush_all)


@dataclass
class Hit:
    """A verified prefix match: restore ``load()`` (state of all ``tokens``), then trim to ``n_tokens``."""

    n_tokens: int
    tokens: list[int]
    tier: str
    entry: Entry
    payload: object

    def load(self):
        """The state payload (already read and checksum-verified)."""
        return self.payload


class PromptCache:
    """An unbound prompt cache for one model reference and its load options."""

    def __init__(self, ref, options=None, *, root: Path | None = None, ram_bytes: int | None = None,
                 disk_bytes: int | None = None, block: int = BLOCK, hash_fn: HashFn = blake2_chain) -> None:
        self.ref = ref
        self.options = options
        self.root = Path(root) if root is not None else config.cache_dir()
        self.ram_bytes = config.cache_ram_bytes() if ram_bytes is None else ram_bytes
        self.disk_bytes = config.cache_disk_bytes() if disk_bytes is None else disk_bytes
        self.block = block
        self.hash_fn = hash_fn

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
    """The prompt cache of one loaded model. Engine-facing methods run on its loop thread only."""

    def __init__(self, parent: PromptCache, model_path: Path, digest: str | None, salt: dict, model_name: str) -> None:
        self.parent = parent
        self.root = parent.root
        self.block = parent.block
        self.salt = salt
        self.model_name = model_name
        self.model_path = model_path
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
        if self._sha is None:
            self._sha_thread = threading.Thread(target=self._hash_model, name="ollapy-cache-sha", daemon=True)
            self._sha_thread.start()
        _LIVE.add(self)

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
            e.pinned = e.pinned or pinned
            e.last_used = max(e.last_used, mtime) if e.payload is not None else mtime

    def _forget(self, e: Entry) -> None:
        self.entries.pop(e.name, None)
        if self.index is not None:
            self.index.remove(e)
        self.ram.drop(e)

    # ---- engine API ------------------------------------------------------------------------
    def lookup(self, tokens: list[int]) -> Hit | None:
        """The saved state sharing the longest verified prefix with ``tokens`` (≥ one block), or None."""
        if len(tokens) < self.block or not self._ready():
            return None
        with self._lock:
            self._refresh()
            tried: set[int] = set()
            whole = (lambda x: len(x.tokens) < len(tokens)) if not self.trimmable else (lambda x: True)
            while True:
                e, n = self.index.best(tokens, accept=lambda x: id(x) not in tried and whole(x))
                if e is None:
                    return None
                tried.add(id(e))
                if not self.trimmable and n != len(e.tokens):
                    continue  # a sliding-window state must be used whole, as a strict prefix of the prompt
                if e.payload is not None:
                    return Hit(n, list(e.tokens), "ram", e, e.payload)
                if not e.on_disk or e.path is None:
                    continue
                data = self.disk.load(e)
                if data is None:
                    self.stats.add(corrupt=1)
                    self._forget(e)
                    continue
                return Hit(n, list(e.tokens), "disk", e, data)

    def record_hit(self, hit: Hit) -> None:
        """The engine restored ``hit``: count it, mark the entry used, keep it in RAM."""
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
        hit.payload = None

    def record_refused(self, hit: Hit) -> None:
        """llama.cpp refused the state: a miss; the entry is deleted from both tiers."""
        log.debug("prompt cache: llama.cpp refused state %s (%d tokens); deleting it", hit.entry.name, len(hit.tokens))
        self.stats.add(refused=1, misses=1)
        with self._lock:
            self._forget(hit.entry)
            self.disk.delete(hit.entry)
        hit.payload = None

    def record_miss(self) -> None:
        """Nothing usable was found."""
        self.stats.add(misses=1)

    def store(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool = False) -> None:
        """Save the state of ``tokens`` (``get_state`` is called now; the disk write happens later)."""
        if len(tokens) < self.block or not self._ready():
            return
        tokens = list(tokens)
        with self._lock:
            covering = self.index.covering(tokens)
            if not self.trimmable:  # states of sliding-window models cannot be trimmed: keep each prefix
                covering = [e for e in covering if len(e.tokens) == len(tokens)]
            if covering:
                if pinned:
                    for e in covering:
                        if not e.pinned:
                            self.disk.set_pin(e, True)
                            if e.pending:
                                e.pinned = True
                            break
                self.stats.add(skipped_stores=1)
                return
            payload = get_state()
            if not payload:
                return
            e = Entry(name=self._name(tokens), tokens=tokens, nbytes=len(payload), pinned=pinned,
                      preview=self._preview(tokens))
            replaced = [r for r in self.index.covered_by(tokens) if pinned or not r.pinned] if self.trimmable else []
            for r in replaced:
                r.superseded = True
                self._forget(r)
            self.entries[e.name] = e
            self.index.add(e)
            for dropped in self.ram.put(e, payload):
                if not dropped.on_disk and not dropped.pending:
                    self._forget(dropped)
            self.disk.write_async(e, payload, replaced)
            self.stats.add(stores=1, bytes_written=len(payload))

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

    def info(self) -> dict:
        """Entries and bytes of this model's cache as this process sees it."""
        return {
            "entries": len(self.entries),
            "ram_bytes": self.ram.bytes,
            "ram_pinned_bytes": self.ram.pinned_bytes(),
            "directory": str(self.disk.dir) if self.disk is not None else None,
            **self.stats.c,
        }

    def close(self) -> None:
        """Flush and drop the RAM tier."""
        self.flush()
        for e in list(self.ram.entries.values()):
            self.ram.drop(e)


def open_prompt_cache(ref, options=None) -> PromptCache | None:
    """The prompt cache for ``ref`` with load ``options``; None when ``OLLAPY_CACHE=0``."""
    if not config.cache_enabled():
        return None
    return PromptCache(ref, options)
