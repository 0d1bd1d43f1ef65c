"""The index's sync with the disk directory, for a bound prompt cache: :class:`EntryCatalog`.

Once the model's sha256 is known, :meth:`EntryCatalog._setup` creates the
block index and the disk tier, indexes the directory and takes in the states
stored before; :meth:`EntryCatalog._refresh` (the sync thread,
:mod:`ollapy.cache.sync`) lists the directory again and applies the
difference: new files in, vanished files out. Directory listings and header
reads run without the cache's lock. :class:`~ollapy.cache.manager.BoundCache`
(:mod:`ollapy.cache.manager`) is the facade this class is a base of.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from ollapy.cache.blocks import BLOCK_TOKENS
from ollapy.cache.index import BlockIndex
from ollapy.cache.salt import salt_key
from ollapy.cache.tiers import LAYOUT, DiskTier, Entry


class EntryCatalog:
    """The entries and block index of :class:`~ollapy.cache.manager.BoundCache` kept in step with its disk
    directory (a base class: the attributes below are set by ``BoundCache.__init__``; ``_forget`` is its method
    and ``_store_locked`` :class:`~ollapy.cache.intake.StateIntake`'s)."""

    parent: object
    root: Path
    block: int
    block_tokens: int
    salt: dict
    model_name: str
    index: BlockIndex | None
    disk: DiskTier | None
    entries: dict[str, Entry]
    _lock: threading.RLock
    _early: list[tuple[list[int], object, bool, bool]]
    _sha: str | None

    def _setup(self) -> None:
        """Create the index and the disk tier, index the directory, then take in what was stored before."""
        skey = salt_key(self.salt)
        directory = self.root / LAYOUT / f"{self._sha[:16]}-{skey}"
        seed = hashlib.blake2b((self._sha + json.dumps(self.salt, sort_keys=True)).encode(), digest_size=16).digest()
        disk = DiskTier(self.root, directory, self._sha, self.salt, self.model_name, self.parent.disk_bytes,
                        block_tokens=self.block_tokens or BLOCK_TOKENS, queue_bytes=self.parent.queue_bytes)
        listing = disk.listing()
        fresh = {name: e for name, (path, _, _) in listing.items() if (e := disk.open_entry(name, path)) is not None}
        with self._lock:
            self.disk = disk
            self.index = BlockIndex(seed, self.block, self.parent.hash_fn)
            self._apply_listing(listing, fresh, set())
            early, self._early = self._early, []
            for tokens, payload, pinned, persist in early:
                self._store_locked(tokens, lambda p=payload: p, pinned, persist)

    def _refresh(self) -> None:
        """Sync the index with the disk directory (sync thread): new files in, vanished files out.

        The listing and the header reads run without the lock; only entries
        that were on disk before the listing started can be found vanished
        (a write that lands during the listing is not mistaken for a deletion).
        """
        disk = self.disk
        if disk is None:
            return
        with self._lock:
            stable = {n for n, e in self.entries.items() if e.on_disk and not e.pending}
            known = set(self.entries)
        listing = disk.listing()
        fresh = {name: e for name, (path, _, _) in listing.items()
                 if name not in known and (e := disk.open_entry(name, path)) is not None}
        with self._lock:
            self._apply_listing(listing, fresh, stable)

    def _apply_listing(self, listing: dict, fresh: dict[str, Entry], stable: set[str]) -> None:
        for name in stable - listing.keys():
            e = self.entries.get(name)
            if e is not None and e.on_disk and not e.pending:
                e.on_disk = False
                if e.payload is None:
                    self._forget(e)
        for name, (path, mtime, pinned) in listing.items():
            e = self.entries.get(name)
            if e is None:
                e = fresh.get(name)
                if e is None:
                    continue
                self.entries[name] = e
                self.index.add(e)
            e.on_disk = True
            e.path = path
            e.pinned = e.pinned or pinned
            e.last_used = max(e.last_used, mtime) if e.payload is not None else mtime
