"""The remote tier: the block pool and its entries mirrored as values in Valkey/Redis, under RAM and disk.

:class:`RemoteTier` sits between a bound prompt cache (:mod:`ollapy.cache.manager`) and a
:class:`~ollapy.cache.remote.RemoteStore`; the keys and values are :mod:`ollapy.cache.remote_format`'s.

Lookup (:meth:`RemoteTier.peek`, the engine's loop thread): the prompt's anchors (the chain hashes of its
64-token index blocks, already computed by the index) name the entries that could serve it; one pipelined
``EXISTS`` finds which the store holds, then the deepest one's value (token ids, block chain, tail) is read
and checked: its tokens against the prompt, its block names against the chain recomputed from its own tokens.
A cost gate keeps a candidate only when fetching it is cheaper than prefilling its tokens: the measured GET
bandwidth (a default until a MiB was read) against the model's measured prefill rate (when the engine
reported one: :meth:`RemoteTier.note_prefill`).

Restore (:meth:`RemoteTier.fetch`): the blocks stream in by pipelined ``GET`` s of a few values per round
trip, each checked as it arrives (header, tokens, parent, crc32), under a deadline (the prefill time it
saves). A block that is missing (evicted between lookup and read), fails a check or arrives after the
deadline ends the chain: a trimmable model restores the verified prefix of full blocks
(:func:`ollapy.cache.kvstate.prefix_state`); otherwise it is a miss. Nothing is retried.

Writes (:meth:`RemoteTier.offer`, under the cache's lock, so only queueing): an entry that reaches the disk
tier (or is due to) is offered with its blocks; blocks this process knows the store holds are not sent again,
and the store's ``SET NX`` keeps the first copy of a block that two replicas send at once.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ollapy.cache.index import BlockIndex, HashFn, blake2_chain
from ollapy.cache.remote import RemoteStore
from ollapy.cache.remote_format import (
    RemoteValueError,
    block_key,
    decode,
    encode_parts,
    entry_key,
    n_parts,
    part_key,
)
from ollapy.cache.tiers import Entry
from ollapy.tokens import common_prefix

log = logging.getLogger("ollapy.cache")

BLOCK_TOKENS = 16  # tokens per remote block: an entry's tail (under one block) is all a turn sends twice
DEFAULT_BANDWIDTH = 300e6  # bytes/s assumed until a MiB was read (loopback GETs from Python: about 1 GB/s)
MIN_DEADLINE_S = 0.05
SKIP_S = 30.0  # an entry whose chain broke (a block evicted or bad) is not offered again for this long
KNOWN_BLOCKS = 65536  # block names remembered as held by the store (an LRU: a forgotten one is sent again)
KNOWN_ENTRIES = 1024  # entry keys remembered with the tokens the store holds there (an LRU)

__all__ = ["BLOCK_TOKENS", "RemoteEntry", "RemoteTier"]


@dataclass
class RemoteEntry:
    """A checked entry value of the store: what :class:`~ollapy.cache.tiers.Entry.header` holds for a
    candidate of the remote tier."""

    key: str
    tokens: list[int]
    blocks: tuple[str, ...]
    block_tokens: int
    state_len: int
    block_len: int
    block_parts: int
    tail_parts: int
    tail0: memoryview  # the tail's first part (from the entry value itself)


class RemoteTier:
    """The remote tier of one bound cache (one model sha256 and KV salt, tenant included).

    ``index_block``: tokens per index block (the anchors' grid); ``trimmable``: whether a state may be cut to
    a prefix of its blocks (False for sliding-window models). ``stats``: the cache's
    :class:`~ollapy.cache.stats.Stats` (remote hits, misses, corrupt values, bytes are counted there).
    """

    def __init__(self, store: RemoteStore, namespace: str, model_sha256: str, salt: dict, index_block: int,
                 trimmable: bool, stats, kv=None, seed: bytes = b"", hash_fn: HashFn = blake2_chain) -> None:
        assert index_block % BLOCK_TOKENS == 0, (index_block, BLOCK_TOKENS)
        self.store = store
        self._blocks = BlockIndex(seed, BLOCK_TOKENS, hash_fn)  # names the remote blocks (its chain only)
        self.namespace = namespace
        self.model_sha256 = model_sha256
        self.salt = salt
        self.index_block = index_block
        self.trimmable = trimmable
        self.stats = stats
        self.kv = kv
        self.prefill_tps: float | None = None  # the model's measured prefill rate, tokens/s (note_prefill)
        self._names = threading.Lock()  # guards _held and _skip (the engine's thread and the cache's writers)
        self._held: OrderedDict[str, None] = OrderedDict()  # block names the store is known to hold
        self._skip: OrderedDict[str, float] = OrderedDict()  # entry key -> until when its broken chain is skipped
        self._entries: OrderedDict[str, tuple] = OrderedDict()  # entry key -> the tokens the store held there

    def block_names(self, tokens, limit: int | None = None) -> list[str]:
        """The names of the remote blocks of ``tokens`` (:data:`BLOCK_TOKENS` each, at most ``limit``): their chain
        hashes, hex, seeded as the index's are (the model's sha256 and the KV salt, tenant included)."""
        return [h.hex() for h in self._blocks.chain(tokens, limit)]

    # ---- cost model --------------------------------------------------------------------------
    def note_prefill(self, n_tokens: int, seconds: float) -> None:
        """The engine prefilled ``n_tokens`` in ``seconds``: an exponential average of the prefill rate."""
        if n_tokens < 64 or seconds <= 0:
            return
        rate = n_tokens / seconds
        self.prefill_tps = rate if self.prefill_tps is None else 0.7 * self.prefill_tps + 0.3 * rate

    def _fetch_s(self, nbytes: int) -> float:
        bw = self.store.bandwidth() or DEFAULT_BANDWIDTH
        return nbytes / bw + 2 * self.store.snapshot().probe_ms / 1e3

    def _prefill_s(self, n_tokens: int) -> float | None:
        return None if not self.prefill_tps else n_tokens / self.prefill_tps

    # ---- lookup ------------------------------------------------------------------------------
    def peek(self, tokens: list[int], chain: list[bytes], better_than: int, exclude=frozenset()) -> tuple[Entry, int] | None:
        """The store's deepest entry sharing more than ``better_than`` verified tokens with ``tokens``:
        ``(entry, shared tokens)``, the entry's ``header`` a :class:`RemoteEntry`; None when there is none, it
        does not pay, or the store fails. ``chain``: the index's chain hashes of ``tokens``."""
        # an entry anchored at the block holding ``better_than`` may reach past it: anchors below cannot
        depth0 = max(0, better_than // self.index_block - 1)
        anchors = [h.hex() for h in chain[depth0:]]
        keys = [entry_key(self.namespace, a) for a in anchors]
        now = time.monotonic()
        with self._names:
            while self._skip and next(iter(self._skip.values())) < now:
                self._skip.popitem(last=False)
            keys = [k for k in keys if f"remote:{k}" not in exclude and k not in self._skip]
        if not keys:
            return None
        present = self.store.exists(keys)
        if not present:
            return None
        for key, there in zip(reversed(keys), reversed(present)):
            if not there:
                continue
            found = self._entry(key, tokens)
            if found is None:
                continue
            e, n = found
            if n <= better_than:
                return None
            if not self._pays(e, n, better_than):
                self.stats.add(remote_gated=1)
                return None
            return e, n
        return None

    def _entry(self, key: str, tokens: list[int]) -> tuple[Entry, int] | None:
        """The entry value under ``key``, checked against this cache and ``tokens``; None (a counted miss)."""
        raw = self.store.get_one(key)
        if raw is None:
            self.stats.add(remote_misses=1)  # evicted since the EXISTS, or the store failed
            return None
        try:
            hdr, tail0 = decode(raw, "entry", key, 0, self.model_sha256, self.salt)
            m = hdr.meta
            r = RemoteEntry(key, [int(t) for t in m["tokens"]], tuple(str(b) for b in m["blocks"]),
                            int(m["block_tokens"]), int(m["state_len"]), int(m["block_len"]), int(m["block_parts"]),
                            hdr.n_parts, tail0)
            self._check_chain(r)
        except (RemoteValueError, KeyError, TypeError, ValueError) as exc:
            log.debug("prompt cache: remote entry %s: %s", key, exc)
            self.stats.add(remote_corrupt=1, remote_misses=1)
            return None
        self._note_entry(key, r.tokens)
        n = common_prefix(r.tokens, tokens)
        if n < self.index_block or not (self.trimmable or n == len(r.tokens) < len(tokens)):
            return None
        return Entry(name=f"remote:{key}", tokens=r.tokens, nbytes=r.state_len, header=r, blocks=r.blocks,
                     block_tokens=r.block_tokens), n

    def _check_chain(self, r: RemoteEntry) -> None:
        """The entry's block names must be the chain hashes of its own tokens (trust nothing the value says)."""
        if not r.blocks or r.block_tokens != BLOCK_TOKENS or len(r.blocks) * r.block_tokens > len(r.tokens):
            raise RemoteValueError("bad block chain")
        if r.block_parts != n_parts(r.block_len):
            raise RemoteValueError("bad block parts")
        if list(r.blocks) != self.block_names(r.tokens, len(r.blocks)):
            raise RemoteValueError("block names are not the chain of the entry's tokens")

    def _pays(self, e: Entry, n: int, better_than: int) -> bool:
        """Fetching ``e`` beats prefilling the ``n - better_than`` tokens it adds plus restoring the local
        ``better_than`` (estimated at the store's bandwidth: a conservative stand-in for the local read)."""
        prefill = self._prefill_s(n - better_than)
        if prefill is None:
            return True
        fetch = self._fetch_s(e.nbytes)
        return fetch < prefill + fetch * better_than / max(n, 1)

    # ---- restore -----------------------------------------------------------------------------
    def fetch(self, e: Entry, buffer: Callable[[int], object] | None = None):
        """Read ``e``'s blocks and tail (``e`` from :meth:`peek`): ``(blocks, tail, n_blocks, state)`` where
        ``n_blocks == len(e.blocks)`` for the whole state, fewer for a verified prefix (a trimmable model only:
        the caller cuts the state to ``n_blocks`` blocks), or None (a counted miss). :meth:`peek` checked that
        the entry's block names are the chain of its own tokens; each block read is checked against them.

        ``buffer(size)``: a writable buffer of at least ``size`` bytes; given (and the splitter assembles
        states: :class:`ollapy.cache.kvstate.StateAssembler`), each block is written into its place in it as
        soon as it arrived and passed its checks, while the store's reader thread receives the next ones
        (:meth:`RemoteStore.get_many`), and ``state`` is the whole state (a view of it) when every block
        came, ``blocks`` then a list of None (each value is freed once placed); otherwise ``state`` is None and
        the caller joins ``blocks`` and ``tail``."""
        r: RemoteEntry = e.header
        keys = self.value_keys(r)
        prefill = self._prefill_s(len(e.tokens))
        budget = max(MIN_DEADLINE_S, prefill if prefill is not None else 4 * self._fetch_s(e.nbytes) + 0.5)
        deadline = time.monotonic() + budget
        tail = [r.tail0]
        blocks: list = []
        pieces: list = []
        asm = None
        bad = False
        t0 = time.perf_counter()
        nread = 0
        values = self.store.get_many(keys, deadline)
        try:
            for i, key in enumerate([None, *keys]):
                if len(tail) == r.tail_parts and asm is None and buffer is not None \
                        and hasattr(self.kv, "StateAssembler"):
                    whole = _joined(tail)
                    asm = self.kv.StateAssembler(whole, buffer(self.kv.joined_size(whole)))
                    tail = [whole]
                if key is None:
                    continue
                i -= 1
                raw = next(values, None)
                if raw is None:  # missing (evicted, the store restarted), the store failed, or past the deadline
                    self._forget(r.blocks[max(0, (i - r.tail_parts + 1) // r.block_parts):])
                    break
                nread += len(raw)
                if i < r.tail_parts - 1:
                    _, p = decode(raw, "entry", r.key, i + 1, self.model_sha256, self.salt)
                    tail.append(p)
                    continue
                j, part = divmod(i - (r.tail_parts - 1), r.block_parts)
                name = r.blocks[j]
                hdr, p = decode(raw, "block", block_key(self.namespace, name), part, self.model_sha256, self.salt)
                b = r.block_tokens
                if hdr.n_parts != r.block_parts or [int(t) for t in hdr.meta["tokens"]] != r.tokens[j * b:(j + 1) * b] \
                        or hdr.meta.get("parent", "") != (r.blocks[j - 1] if j else ""):
                    raise RemoteValueError("block tokens or parent do not match the entry")
                pieces.append(p)
                if part == r.block_parts - 1:
                    block = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
                    if len(block) != r.block_len:
                        raise RemoteValueError(f"block {j} holds {len(block)} bytes, the entry says {r.block_len}")
                    if asm is not None:  # placed: the value is freed now, not held to the end (twice the state)
                        asm.put(j, block)
                        block = None
                    blocks.append(block)
                    pieces = []
        except (RemoteValueError, KeyError, TypeError, ValueError) as exc:  # ValueError: KVStateError too
            log.debug("prompt cache: remote value of %s: %s", r.key, exc)
            bad = True
        finally:
            values.close()
        self.stats.add(remote_bytes_read=nread)
        if bad:
            self.stats.add(remote_corrupt=1)
        if bad or len(blocks) < len(r.blocks):  # a broken chain is not fetched again at every lookup for a while
            with self._names:
                self._skip[r.key] = time.monotonic() + SKIP_S
                self._skip.move_to_end(r.key)
                while len(self._skip) > KNOWN_BLOCKS:
                    self._skip.popitem(last=False)
        whole_tail = len(tail) == r.tail_parts or asm is not None
        if whole_tail and len(blocks) == len(r.blocks):
            self._remember(r.blocks)
            log.debug("prompt cache: remote restore of %d blocks (%d bytes) in %.1f ms", len(blocks), nread,
                      (time.perf_counter() - t0) * 1e3)
            state = asm.out[:asm.size] if asm is not None else None
            return blocks, _joined(tail), len(blocks), state
        if whole_tail and blocks and self.trimmable:
            k, tail = len(blocks), _joined(tail)
            if asm is not None:  # the blocks were placed and freed: cut them out of the state assembled so far
                cut = self.kv.split_state(asm.out[:asm.size], r.block_tokens)
                blocks, tail = (cut.blocks[:k], cut.tail) if cut is not None else ([], tail)
            if blocks:
                self._remember(r.blocks[:k])
                self.stats.add(remote_partial=1)
                return blocks, tail, k, None
        self.stats.add(remote_misses=1)
        return None

    def value_keys(self, r: RemoteEntry) -> list[str]:
        """The keys a restore of ``r`` reads, in order: the tail's parts after the first, then each block's parts."""
        keys = [part_key(r.key, i) for i in range(1, r.tail_parts)]
        for name in r.blocks:
            bkey = block_key(self.namespace, name)
            keys.extend(part_key(bkey, i) for i in range(r.block_parts))
        return keys

    def _forget(self, names) -> None:
        """Block names the store may no longer hold: a later :meth:`offer` sends them again."""
        with self._names:
            for n in names:
                self._held.pop(n, None)

    def _note_entry(self, key: str, tokens) -> None:
        """The store holds (wrote or read) the entry of ``tokens`` under ``key``: a state that is a prefix of it
        is not sent (the stored one serves every prompt the shorter one would)."""
        with self._names:
            self._entries[key] = tuple(tokens)
            self._entries.move_to_end(key)
            while len(self._entries) > KNOWN_ENTRIES:
                self._entries.popitem(last=False)

    def _holds_longer(self, key: str, tokens: list[int]) -> bool:
        with self._names:
            known = self._entries.get(key)
        return known is not None and len(known) >= len(tokens) and known[:len(tokens)] == tuple(tokens)

    def _remember(self, names) -> None:
        with self._names:
            for n in names:
                self._held[n] = None
                self._held.move_to_end(n)
            while len(self._held) > KNOWN_BLOCKS:
                self._held.popitem(last=False)

    # ---- writes ------------------------------------------------------------------------------
    def offer(self, tokens: list[int], chain: list[bytes], nbytes: int, whole=None, blocks=None, tail=None) -> bool:
        """Queue the state of ``tokens`` (``nbytes``; ``chain``: the index's chain hashes of ``tokens``, the last
        one its entry's anchor) for the store: given ``whole``, or as the local tiers' ``blocks`` and ``tail``
        (immutable buffers). The writer thread joins it where needed and cuts it into blocks of
        :data:`BLOCK_TOKENS` (so a turn sends its new blocks and a tail under one block), sends the blocks
        this process does not know the store holds (written or found there before), then the entry; a newer
        state of the same anchor supersedes a write still waiting (:meth:`RemoteStore.put_async`). Never
        waits on the store and computes nothing heavy here; False when the queue refused it."""
        if self.kv is None or not chain:
            return False
        tokens, names = list(tokens), self.block_names(tokens)
        anchor, rb = chain[-1].hex(), BLOCK_TOKENS
        sha, salt, ns, kv = self.model_sha256, self.salt, self.namespace, self.kv

        def make() -> list:
            state = whole if whole is not None else kv.join_state(blocks, tail)
            try:
                cut = kv.split_state(state, rb)
            except ValueError:
                cut = None
            if cut is None or cut.n_cells != len(tokens) or len(cut.blocks) != len(names) or not names:
                return []
            with self._names:  # decided when sent, not when queued: an earlier write of this process went first
                held = {n for n in names if n in self._held}
            block_len = len(cut.blocks[0])
            meta = {"tokens": tokens, "blocks": names, "block_tokens": rb, "state_len": len(state),
                    "block_len": block_len, "block_parts": n_parts(block_len)}
            values = []
            for j, d in enumerate(cut.blocks):
                if names[j] not in held:
                    values += [(k, v, True) for k, v in encode_parts(
                        "block", block_key(ns, names[j]), sha, salt, d,
                        {"tokens": tokens[j * rb:(j + 1) * rb], "parent": names[j - 1] if j else ""})]
            self._remember(names)
            key = entry_key(ns, anchor)
            if self._holds_longer(key, tokens):  # its blocks were all sent: the entry adds nothing
                return values
            self._note_entry(key, tokens)
            return values + [(k, v, False) for k, v in encode_parts("entry", key, sha, salt, cut.tail, meta)]

        return self.store.put_async(make, nbytes, key=entry_key(ns, anchor))

    def snapshot(self) -> dict[str, int]:
        """Gauges of the store client for :class:`~ollapy.cache.stats.CacheStats`."""
        s = self.store.snapshot()
        return dict(remote_bytes_written=s.bytes_written, remote_errors=s.errors, remote_queue_depth=s.queue_depth,
                    remote_queue_bytes=s.queue_bytes, remote_breaker_open=0 if s.breaker == "closed" else 1,
                    remote_probe_us=int(s.probe_ms * 1e3), remote_dropped=s.dropped,
                    remote_bandwidth=int(self.store.bandwidth() or 0))


def _joined(parts: list):
    return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))
