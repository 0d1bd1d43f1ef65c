"""The store path of a bound prompt cache: :class:`StateIntake`.

A state the engine hands :meth:`StateIntake.store` is copied out of llama.cpp
(``get_state``) and cut into blocks (:mod:`ollapy.cache.kvstate`) without the
cache's lock, then entered into the entries, the block index and the RAM tier
under it; it is written to disk where :class:`~ollapy.cache.policy.AdmissionPolicy`
says so (``persist``, a promotion, or :meth:`StateIntake.write_back_now`). The
lookup and restore path, the index's sync with the directory and the lifecycle
are :class:`~ollapy.cache.manager.BoundCache`'s (:mod:`ollapy.cache.manager`),
which this class is a base of.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

from ollapy.cache.blocks import Split
from ollapy.cache.index import BlockIndex
from ollapy.cache.policy import AdmissionPolicy
from ollapy.cache.stats import Stats
from ollapy.cache.sync import IndexSync
from ollapy.cache.tiers import DiskTier, Entry, RamTier

log = logging.getLogger("ollapy.cache")


class StateIntake:
    """The store path of :class:`~ollapy.cache.manager.BoundCache` (a base class: the attributes below are set by
    ``BoundCache.__init__``; ``_forget``, ``_ram_put`` and ``_wait_ready`` are its methods).

    ``store`` runs on the engine's loop thread only; ``_store_locked`` runs under the lock (load time or the sync
    thread); ``write_back_now`` on any thread.
    """

    block: int
    block_tokens: int
    write_delay: float
    kv: object | None
    piece: Callable[[int], bytes] | None
    policy: AdmissionPolicy
    stats: Stats
    ram: RamTier
    index: BlockIndex | None
    disk: DiskTier | None
    entries: dict[str, Entry]
    _lock: threading.RLock
    _early: list[tuple[list[int], object, bool, bool]]
    _closed: bool
    _sync: IndexSync

    def _name(self, tokens: list[int]) -> str:
        from array import array

        h = hashlib.blake2b(self.index.salt + array("i", tokens).tobytes(), digest_size=16)
        return h.hexdigest()

    def store(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool = False,
              persist: bool = False, state_size: Callable[[], int] | None = None, interim: bool = False) -> None:
        """Save the state of ``tokens`` (``get_state`` is called now; a disk write happens later).

        ``persist`` (or ``pinned``) writes through to disk; otherwise the
        state stays in RAM until reuse proves it worth a file
        (:mod:`ollapy.cache.policy`). ``interim`` (with ``persist``): a
        conversation's save point that its next turn is likely to extend; on a
        model whose states serve only whole its write is deferred, and dropped
        if a longer save point of the same chain comes first (write-behind, see
        :mod:`ollapy.cache.policy`). Before the model's sha256 is known the
        state is kept aside in memory and indexed once it is. ``state_size``
        (optional) gives the state's bytes before anything is copied: a state
        no tier would take is never copied out of llama.cpp. The state is
        copied and cut into blocks without the cache's lock.
        """
        if len(tokens) < self.block or self._closed:
            return
        tokens = list(tokens)
        persist = persist or pinned
        with self._lock:
            if self.index is None:
                if not self._sync.ready.is_set():
                    self._keep_early(tokens, get_state, pinned, persist)
                return
            kept = self.policy.already_kept(self.index, tokens, persist)
            if kept:
                if pinned and not any(e.pinned for e in kept):
                    self.disk.set_pin(kept[0], True)
                self.stats.add(skipped_stores=1)
                return
            near = None if pinned else self.policy.near_prefix(self.index, tokens)
            if near is not None:  # a sliding-window state a few tokens past a held one: that one takes its role
                # a deferred write already waiting restarts its delay, as a new save point's would
                if persist and not (near.on_disk or near.pending) and near.payload is not None:
                    self._adopt(near, interim)
                self.stats.add(skipped_stores=1)
                return
        if state_size is not None:
            size = state_size()
            if size <= 0 or (size > self.ram.cap and not (persist and size <= self.disk.cap)):
                log.debug("prompt cache: state of %d bytes fits no tier; not copied", size)
                return
        payload = get_state()
        if not payload:
            return
        split = self._split(tokens, payload)
        with self._lock:
            if self._closed:
                return
            self._insert(tokens, payload, split, pinned, persist, interim and not pinned)

    def _keep_early(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool, persist: bool) -> None:
        payload = get_state()
        if not payload or len(payload) > self.ram.cap:
            return
        self._early.append((tokens, payload, pinned, persist))
        while sum(len(x[1]) for x in self._early) > self.ram.cap:
            self._early.pop(0)

    def _store_locked(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool, persist: bool) -> None:
        """Store a state kept aside before the sha256 was known (under the lock: load time or the sync thread)."""
        persist = persist or pinned
        if self.policy.already_kept(self.index, tokens, persist):
            self.stats.add(skipped_stores=1)
            return
        payload = get_state()
        if payload:
            self._insert(tokens, payload, self._split(tokens, payload), pinned, persist)

    def _split(self, tokens: list[int], payload) -> Split | None:
        """``payload`` cut into blocks named by the index's chain hashes, or None (kept whole: the splitter does
        not recognise the state, or it holds other cells than ``tokens``)."""
        b = self.block_tokens
        if not b or self.kv is None or len(tokens) < b or self.index is None:
            return None
        try:
            cut = self.kv.split_state(payload, b)
        except Exception:  # noqa: BLE001 - an unrecognised state is kept whole, never a failed request
            log.debug("prompt cache: state not split", exc_info=True)
            cut = None
        if cut is None or cut.n_cells != len(tokens) or len(cut.blocks) != len(tokens) // b:
            self.stats.add(whole_states=1)
            return None
        step = b // self.block
        chain = self.index.chain(tokens, limit=len(cut.blocks) * step)
        names = [chain[(i + 1) * step - 1].hex() for i in range(len(cut.blocks))]
        return Split(names, list(cut.blocks), cut.tail, len(payload))

    def _replaced(self, e: Entry, persist: bool) -> list[Entry]:
        """Strict prefixes a new entry makes redundant: whole states only (a block entry's prefix costs its
        tail, and serves the next conversation that shares it)."""
        replaced = self.policy.replaced_by(self.index, e.tokens, persist, e.pinned)
        return [r for r in replaced if not r.blocks] if e.blocks else replaced

    def _insert(self, tokens: list[int], payload, split: Split | None, pinned: bool, persist: bool,
                interim: bool = False) -> None:
        e = Entry(name=self._name(tokens), tokens=tokens, nbytes=len(payload), pinned=pinned,
                  preview=self._preview(tokens), interim=interim)
        if split is not None:
            e.blocks, e.block_tokens = tuple(split.names), self.block_tokens
        old = self.entries.get(e.name)
        if old is not None:
            self._forget(old)
        replaced = self._replaced(e, persist)
        if persist:
            self._supersede(tokens)
        for r in replaced:
            r.superseded = True
            self._forget(r)
        self.entries[e.name] = e
        self.index.add(e)
        if split is not None:
            self._ram_put(e, split.tail, split.blocks)
        else:
            self._ram_put(e, payload)
        self.stats.add(stores=1, bytes_stored=len(payload))
        if not persist and e.payload is not None:
            self._release_continued(e)
        # the remote tier gets every state now (a turn's end too: another replica may take the next turn), even
        # when its disk write waits
        self._offer_remote(e, payload if split is None else None, *((split.blocks, split.tail) if split else ()))
        if persist and self.policy.defers(e) and e.payload is not None:
            e.due = time.monotonic() + self.write_delay  # written when due, evicted, or at close
        elif persist:
            self._persist(e, e.payload if e.payload is not None else (split.tail if split else payload), replaced,
                          split.blocks if split is not None else None)
        elif e.payload is None:  # larger than the RAM tier and not worth a file: nothing kept
            self._forget(e)

    def _supersede(self, tokens: list[int], keep: Entry | None = None) -> None:
        """Cancel the deferred writes that a save point of ``tokens`` makes unnecessary: its chain's shorter ones
        (:meth:`AdmissionPolicy.superseded_by`), but ``keep``. They stay in RAM (under the lock)."""
        for r in self.policy.superseded_by(self.index, tokens):
            if r is keep:
                continue
            log.debug("prompt cache: %s (%d tokens) superseded by a save point of %d: kept in RAM, not written",
                      r.name, len(r.tokens), len(tokens))
            self.stats.add(superseded=1)
            r.due = 0.0

    def _adopt(self, e: Entry, interim: bool) -> None:
        """Write RAM-only ``e`` as the save point it stands in for (:meth:`store`'s ``persist``, ``interim``),
        deferred where the policy defers it, as :meth:`_insert` would have written the save point (under the
        lock)."""
        e.interim = interim
        self._supersede(e.tokens, keep=e)
        if self.policy.defers(e):
            e.due = time.monotonic() + self.write_delay
        else:
            self._persist(e, e.payload, [])

    def _release_continued(self, e: Entry) -> None:
        """Drop from RAM the states that the request which left ``e`` continued from (under the lock), on a model
        whose states serve only whole (:meth:`AdmissionPolicy.continued_by`). A deferred write of a restored one
        moves to ``e``: the conversation reaches the disk once per pause, as its newest state."""
        for r in self.policy.continued_by(self.index, e.tokens):  # strict prefixes: never e
            if r.due > 0:
                e.interim = True
                e.due = max(e.due, r.due)
            log.debug("prompt cache: %s (%d tokens) continued by a state of %d: dropped from RAM", r.name,
                      len(r.tokens), len(e.tokens))
            self.stats.add(continued=1)
            self._forget(r)

    def _write_deferred(self, e: Entry) -> None:
        """Queue the deferred write of ``e`` now (under the lock). Shorter deferred states of its chain are not
        written (they stay in RAM); the interim states of its chain that reached the disk or the writer's queue
        before it are deleted once it is written (a queued one is still written first: it may carry blocks that
        ``e``'s write counts on)."""
        if e.due <= 0 or e.payload is None or self.entries.get(e.name) is not e:
            e.due = 0.0
            return
        e.due = 0.0
        older = []
        for r in self.index.covered_by(e.tokens):
            if r is e or r.pinned or not r.interim:
                continue
            if r.due > 0:
                r.due = 0.0
                self.stats.add(superseded=1)
            elif r.on_disk or r.pending:
                older.append(r)
                self._forget(r)
        self._persist(e, e.payload, older)

    def write_due(self, everything: bool = False) -> int:
        """Queue the deferred writes that are due (``everything``: all of them, as at close); returns how many.

        Only a model whose states serve only whole defers writes: elsewhere this returns at once (the sync thread
        calls it every second)."""
        if self.index is None or self.policy.trimmable:
            return 0
        now = time.monotonic()
        with self._lock:
            todo = [e for e in self.entries.values() if e.due > 0 and (everything or e.due <= now)]
            for e in sorted(todo, key=lambda x: len(x.tokens), reverse=True):  # the longest of a chain first
                self._write_deferred(e)
        return len(todo)

    def _persist(self, e: Entry, payload, replaced: list[Entry], blocks=None) -> None:
        if e.blocks and blocks is None:
            blocks = self.ram.blocks_of(e)
            if blocks is None:
                return
        counts = self.disk.write_async(e, payload, replaced, blocks)
        if counts is not None:
            self.stats.add(bytes_written=counts.nbytes, files_written=1, blocks_written=counts.blocks_written,
                           blocks_reused=counts.blocks_reused)

    def _preview(self, tokens: list[int]) -> str:
        if self.piece is None:
            return ""
        try:
            raw = b"".join(self.piece(t) for t in tokens[:48])
            return " ".join(raw.decode("utf-8", "replace").split())[:120]
        except Exception:  # noqa: BLE001 - a preview is cosmetic
            return ""

    def write_back_now(self, newest: int | None = None) -> int:
        """Queue disk writes of RAM-only entries that no persisted entry covers; returns how many.

        ``newest``: only the ``newest`` most recently used such entries (``close``
        writes back :data:`~ollapy.cache.policy.WRITE_BACK_NEWEST`: the
        conversation a next process may continue, not every one-off answer of
        an ``--each-line`` batch); None writes them all.
        """
        if not self._wait_ready():
            return 0
        n = 0
        with self._lock:
            for e in self.policy.write_back(self.index, list(self.entries.values()), newest):
                if e.superseded:  # replaced by a longer one written just now
                    continue
                replaced = self._replaced(e, True)
                for r in replaced:
                    r.superseded = True
                    self._forget(r)
                self._persist(e, e.payload, replaced)
                n += 1
        return n
