"""The engine's contract with a prompt cache: :class:`PrefixSource` and what it hands back.

The engine (:mod:`ollapy.engine.engine`) sees saved prefix states only
through these Protocols; :class:`ollapy.cache.manager.BoundCache` satisfies
them structurally, so the engine imports nothing of ``ollapy.cache`` and the
cache imports nothing of the engine (docs/design/DESIGN.md, "Layers"). Tests put
fakes behind the same Protocol.

The engine's calls, all from its loop thread, for one request:

1. :meth:`PrefixSource.peek` offers the longest verified prefix (nothing read
   yet); the planner weighs it against the slots' own KV. When the planner
   does not take it, the engine asks again with the offer's ``name`` in
   ``exclude`` and gets the next shorter prefix (a system-prompt state hidden
   behind a long chat state), until one is taken or none is left.
2. :meth:`PrefixSource.load` reads the chosen state; the engine restores it
   (``llama_state_seq_set_data``) and reports exactly one outcome:
   :meth:`~PrefixSource.record_hit`, :meth:`~PrefixSource.record_refused`
   (llama.cpp would not take it) or :meth:`~PrefixSource.record_corrupt`
   (its deferred checksum failed). :meth:`~PrefixSource.record_miss` when no
   candidate was offered at all.
3. :meth:`PrefixSource.store` offers a slot's state at save points and when
   a request ends.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol, runtime_checkable


class PrefixCandidate(Protocol):
    """A saved state that shares ``n_tokens`` verified tokens with the prompt; ``nbytes`` to restore it."""

    @property
    def name(self) -> str:
        """Stable identity of the saved state (what ``peek``'s ``exclude`` takes)."""
        ...

    @property
    def n_tokens(self) -> int:
        """Tokens of the prompt the state holds (verified token by token)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes a restore moves."""
        ...

    @property
    def tier(self) -> str:
        """Where it lives: ``ram`` or ``disk`` (shown as the prefix source ``cache ram``/``cache disk``)."""
        ...


class PrefixHit(Protocol):
    """A loaded state: ``tokens`` it holds (all of them; the engine trims to the planned reuse)."""

    @property
    def tokens(self) -> list[int]:
        """Every token whose KV the state holds, in position order."""
        ...

    def load(self) -> bytes | bytearray | memoryview:
        """The state bytes for ``llama_state_seq_set_data``."""
        ...

    def verified(self) -> bool:
        """True when the bytes passed their checksum (may wait for a check running beside the restore)."""
        ...


@runtime_checkable
class PrefixSource(Protocol):
    """Saved prefix states the engine can restore instead of prefilling (a prompt cache)."""

    def peek(self, tokens: list[int], max_tokens: int | None = None,
             exclude: Collection[str] = frozenset()) -> PrefixCandidate | None:
        """The state sharing the longest verified prefix with ``tokens`` (not longer than ``max_tokens``,
        none named in ``exclude``), or None. Reads no state and never blocks on a disk."""
        ...

    def load(self, cand: PrefixCandidate, defer_check: bool = False) -> PrefixHit | None:
        """Read ``cand``'s state; None when it is gone or failed a check (the next ``peek`` skips it).
        ``defer_check``: verify the checksum beside the restore (see :meth:`PrefixHit.verified`)."""
        ...

    def record_hit(self, hit: PrefixHit, promote: bool = True, n_used: int | None = None) -> None:
        """``hit`` was restored and is used. ``promote`` False: the request will store a longer state of this
        prefix to disk itself (a save point beyond it), so a RAM-only ``hit`` need not be written first.
        ``n_used``: the tokens of it the request keeps (the prompt's last token is evaluated again, so it may be
        fewer than ``hit.n_tokens``; None: all)."""
        ...

    def record_refused(self, hit: PrefixHit) -> None:
        """llama.cpp did not take ``hit`` (e.g. it does not fit this context): skip it from now on."""
        ...

    def record_corrupt(self, hit: PrefixHit) -> None:
        """``hit`` failed its deferred checksum after the restore: drop it."""
        ...

    def record_miss(self) -> None:
        """No candidate was offered for a request."""
        ...

    def record_reuse(self, tokens: list[int], n_tokens: int, promote: bool = True) -> None:
        """A slot's own KV (or a copy of another slot's) served the first ``n_tokens`` of ``tokens`` without a
        restore. A saved RAM-only state of that prefix counts as reused: a conversation that continues this way
        still reaches the disk (where a new process finds it), as a restored one does, unless ``promote`` is
        False (the request persists a longer state of the prefix at a later save point)."""
        ...

    def store(self, tokens: list[int], get_state: Callable[[], bytes], pinned: bool = False,
              persist: bool = False, state_size: Callable[[], int] | None = None, interim: bool = False) -> None:
        """Offer the state of ``tokens`` (``get_state()`` copies it out of llama.cpp, called now or never);
        ``persist`` asks for a disk copy, ``pinned`` for one that is never evicted; ``state_size()`` (optional)
        gives the state's bytes without copying it, so a state no tier would take is never copied; ``interim``:
        a conversation's own save point (not the end of its system prompt), whose write may wait for a longer one."""
        ...
