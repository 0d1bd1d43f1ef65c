"""The bound cache's link to the remote tier: :class:`RemoteLink`, a base of :class:`~ollapy.cache.manager.BoundCache`.

It opens the :class:`~ollapy.cache.remote_tier.RemoteTier` once the model's sha256 and the index exist, offers
the lookup a remote candidate when the store holds a longer prefix than RAM and disk
(:meth:`RemoteLink._peek_remote`), restores one (:meth:`RemoteLink._load_remote`) and queues the entries that
the cache keeps for the store (:meth:`RemoteLink._offer_remote`, called by
:class:`~ollapy.cache.intake.StateIntake`). Without ``OLLAPY_CACHE_REMOTE`` none of it runs.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ollapy.cache.candidate import Candidate, Hit
from ollapy.cache.index import BlockIndex
from ollapy.cache.remote_tier import RemoteTier
from ollapy.cache.tiers import Entry, RamTier

MIN_REMOTE_GAIN = 16  # prompt tokens beyond the local tiers' best prefix that make a store lookup worth its round trip
OFFERED_NAMES = 4096  # entry names remembered as queued for the store (so a promotion does not queue one twice)


class RemoteLink:
    """The remote-tier methods of :class:`~ollapy.cache.manager.BoundCache` (its attributes are set there)."""

    parent: object
    block: int
    block_tokens: int
    index: BlockIndex | None
    ram: RamTier
    remote: RemoteTier | None
    _lock: threading.RLock
    _closed: bool
    _offered: OrderedDict
    _restore_buffer: object

    def _open_remote(self) -> None:
        """The remote tier over the parent's store (once the sha256 and the index exist)."""
        store = self.parent.store
        if store is not None and self.block_tokens and self.index is not None:
            self.remote = RemoteTier(store, self.parent.namespace, self._sha, self.salt, self.block,
                                     self.trimmable, self.stats, self.kv, self.index.salt, self.index.hash_fn)

    def note_prefill(self, n_tokens: int, seconds: float) -> None:
        """The engine prefilled ``n_tokens`` in ``seconds`` (the remote tier's cost gate learns the rate)."""
        if self.remote is not None:
            self.remote.note_prefill(n_tokens, seconds)

    def _offer_remote(self, e: Entry, whole=None, blocks=None, tail=None) -> None:
        """Queue the state of ``e`` for the remote tier, once (under the lock: queueing only): ``whole`` (a state
        kept whole), or ``blocks`` and ``tail`` (the local tiers' cut of it). The remote tier cuts it again into
        blocks of one index block (:meth:`~ollapy.cache.remote_tier.RemoteTier.offer`) on its writer thread."""
        if self.remote is None or e.name in self._offered or len(e.tokens) < self.block:
            return
        if whole is None and (blocks is None or tail is None):
            return
        self._offered[e.name] = None
        while len(self._offered) > OFFERED_NAMES:
            self._offered.popitem(last=False)
        if self.remote.offer(e.tokens, self.index.chain(e.tokens), e.nbytes, whole, blocks, tail):
            self.stats.add(remote_offered=1)

    def _peek_remote(self, tokens: list[int], best: Candidate | None, max_tokens: int | None,
                     exclude) -> Candidate | None:
        """The remote tier's candidate when it serves more of ``tokens`` than ``best`` and pays (the tier's cost
        gate), else ``best``; the store is asked only when ``best`` leaves :data:`MIN_REMOTE_GAIN` tokens or more."""
        have = best.n_tokens if best is not None else 0
        if self.remote is None or len(tokens) - have < MIN_REMOTE_GAIN or len(tokens) < self.block:
            return best
        found = self.remote.peek(tokens, self.index.chain(tokens), have, exclude)
        if found is None or (max_tokens is not None and len(found[0].tokens) > max_tokens):
            return best
        return Candidate(found[0], found[1], "remote")

    def _load_remote(self, cand: Candidate) -> Hit | None:
        """Fetch a remote candidate. A whole chain is assembled into the restore buffer as its blocks arrive
        (or joined, where the splitter cannot assemble) and restored; a verified prefix of it (a trimmable
        model) is taken into the RAM tier and None returned: the engine plans again and finds it there (its plan
        counted on the longer state)."""
        e = cand.entry
        got = self.remote.fetch(e, self._restore_buffer)
        if got is None:
            return None
        blocks, tail, k, state = got
        if k == len(e.blocks):
            if state is None:
                state = self._join(e, blocks, tail)
            return None if state is None else Hit(cand.n_tokens, list(e.tokens), "remote", e, state, n_blocks=k)
        try:
            state = self.kv.prefix_state(blocks, tail, k)
        except ValueError:
            state = None
        if state is not None:
            tokens = list(e.tokens[:k * e.block_tokens])
            split = self._split(tokens, state)
            with self._lock:
                if not self._closed and self.index is not None:
                    self._insert(tokens, state, split, False, False)
        return None
