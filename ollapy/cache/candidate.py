"""What a prompt-cache lookup hands the engine: a :class:`Candidate` (nothing read yet) and a :class:`Hit`.

They satisfy :class:`ollapy.engine.prefix.source.PrefixCandidate` and
:class:`~ollapy.engine.prefix.source.PrefixHit` structurally.
"""
from __future__ import annotations

from dataclasses import dataclass

from ollapy.cache.fileformat import Header, PayloadCheck
from ollapy.cache.tiers import Entry


@dataclass
class Candidate:
    """The best saved prefix for a prompt, before anything is read: ``n_tokens`` verified shared tokens."""

    entry: Entry
    n_tokens: int
    tier: str  # "ram" or "disk"

    @property
    def name(self) -> str:
        """The entry's name (what ``peek``'s ``exclude`` takes)."""
        return self.entry.name

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
    check: PayloadCheck | None = None  # or a blocks.ChecksumsCheck (same ok())
    header: Header | None = None  # the file header a disk payload was mapped through
    parts: object = None  # a block entry read from disk (tiers.Parts): its tail and mapped blocks
    n_blocks: int = 0  # KV blocks the restore read (0: a whole state)

    def load(self):
        """The state payload (checksum-verified, or being verified: see :meth:`verified`)."""
        return self.payload

    def verified(self) -> bool:
        """True when the payload's checksum matched (waits for a deferred check; RAM payloads are trusted)."""
        return self.check is None or self.check.ok()
