"""Hash-chained block index over saved prefixes (vLLM-style automatic prefix caching).

Token lists are cut into blocks of ``block`` tokens; block ``i`` is named by
``h_i = H(h_{i-1} || tokens of block i)`` with ``h_0`` = the salt (model
sha256 + KV settings). Every entry is registered under each of its full
blocks' hashes, so the entries sharing a prompt's first ``d`` blocks are found
with ``d`` dict look-ups. Hashes only propose candidates: every candidate is
confirmed token by token (:func:`common_prefix`), so a collision can never
serve a wrong prefix. The hash function is injectable for tests.
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ollapy.tokens import common_prefix  # noqa: F401  (re-exported: the index's confirmation)

HashFn = Callable[[bytes, bytes], bytes]
T = TypeVar("T")
MAX_CANDIDATES = 32


def blake2_chain(parent: bytes, block: bytes) -> bytes:
    """Default chain step: blake2b-128 of parent hash and block token bytes."""
    return hashlib.blake2b(parent + block, digest_size=16).digest()


def _as_list(tokens) -> list[int]:
    return tokens if isinstance(tokens, list) else list(tokens)


class BlockIndex(Generic[T]):
    """Map block-chain hashes to entries (any object with a ``tokens`` list).

    Not thread-safe: the owner serializes access.
    """

    def __init__(self, salt: bytes, block: int = 64, hash_fn: HashFn = blake2_chain) -> None:
        self.salt = salt
        self.block = block
        self.hash_fn = hash_fn
        self._by_hash: dict[bytes, list[T]] = {}
        self._hashes: dict[int, list[bytes]] = {}

    def chain(self, tokens, limit: int | None = None) -> list[bytes]:
        """Hashes of the full blocks of ``tokens`` (at most ``limit`` blocks)."""
        n_blocks = len(tokens) // self.block
        if limit is not None:
            n_blocks = min(n_blocks, limit)
        out: list[bytes] = []
        h = self.salt
        raw = array("i", tokens[: n_blocks * self.block]).tobytes()
        step = 4 * self.block
        for i in range(n_blocks):
            h = self.hash_fn(h, raw[i * step:(i + 1) * step])
            out.append(h)
        return out

    def add(self, entry: T) -> None:
        """Register ``entry`` under each of its full blocks."""
        key = id(entry)
        if key in self._hashes:
            return
        hashes = self.chain(entry.tokens)
        self._hashes[key] = hashes
        for h in hashes:
            self._by_hash.setdefault(h, []).append(entry)

    def remove(self, entry: T) -> None:
        """Forget ``entry`` (no error when absent)."""
        hashes = self._hashes.pop(id(entry), None)
        for h in hashes or ():
            lst = self._by_hash.get(h)
            if lst is None:
                continue
            lst[:] = [e for e in lst if e is not entry]
            if not lst:
                del self._by_hash[h]

    def __contains__(self, entry: T) -> bool:
        return id(entry) in self._hashes

    def entries(self) -> Iterable[T]:
        """Every registered entry once."""
        seen: dict[int, T] = {}
        for lst in self._by_hash.values():
            for e in lst:
                seen[id(e)] = e
        return list(seen.values())

    def candidates(self, tokens) -> list[T]:
        """Entries sharing at least one full block hash with ``tokens``, deepest match first (bounded)."""
        out: list[T] = []
        seen: set[int] = set()
        depth_lists: list[list[T]] = []
        for h in self.chain(tokens):
            lst = self._by_hash.get(h)
            if not lst:
                break
            depth_lists.append(lst)
        for lst in reversed(depth_lists):
            for e in lst:
                if id(e) not in seen:
                    seen.add(id(e))
                    out.append(e)
                    if len(out) >= MAX_CANDIDATES:
                        return out
        return out

    def best(self, tokens, accept: Callable[[T], bool] = lambda e: True) -> tuple[T | None, int]:
        """The candidate with the longest VERIFIED common prefix with ``tokens``: ``(entry, lcp)``.

        Returns ``(None, 0)`` when no candidate shares at least one full block
        of real tokens.
        """
        tokens = _as_list(tokens)
        best, best_n = None, 0
        for e in self.candidates(tokens):
            if not accept(e):
                continue
            n = common_prefix(e.tokens, tokens)
            if n >= self.block and n > best_n:
                best, best_n = e, n
        return best, best_n

    def covering(self, tokens) -> list[T]:
        """Entries whose tokens start with all of ``tokens`` (verified)."""
        tokens = _as_list(tokens)
        return [e for e in self.candidates(tokens)
                if len(e.tokens) >= len(tokens) and common_prefix(e.tokens, tokens) == len(tokens)]

    def covered_by(self, tokens) -> list[T]:
        """Entries whose tokens are a strict prefix of ``tokens`` (verified)."""
        tokens = _as_list(tokens)
        return [e for e in self.candidates(tokens)
                if len(e.tokens) < len(tokens) and common_prefix(e.tokens, tokens) == len(e.tokens)]
