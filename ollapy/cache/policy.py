"""The prompt cache's admission policy: which states are worth keeping, and which reach the shared disk tier.

:class:`AdmissionPolicy` decides; :class:`~ollapy.cache.manager.BoundCache`
keeps the entries, the index and the tiers in sync and applies the decisions.
The rules (vLLM's automatic prefix caching keeps every block; ollapy writes
files that other processes read, so it writes only what is likely reused):

* ``store(..., persist=True)``: prefixes that later requests start with (the
  end of a system prompt, the end of the previous chat turn) and pinned
  states are written through at once.
* ``persist=False``: the whole state a finished request leaves (its one-off
  question and answer) stays in the RAM tier. It reaches disk only on
  evidence of reuse: a later request restores at least one block more of it
  than any persisted entry offers (a conversation that continues:
  :meth:`AdmissionPolicy.worth_promoting`).
* A state that an existing entry already serves whole is not stored again
  (:meth:`AdmissionPolicy.covering`); a new state makes the strict prefixes
  that are no more durable than it redundant (:meth:`AdmissionPolicy.replaced_by`).
* On a sliding-window model, a state a few tokens past a held prefix of it
  (:meth:`AdmissionPolicy.near_prefix`) is not copied out either: that prefix
  takes its role (a save point's disk write), at one window less.
* A cache bound with ``write_back=True`` (the CLI: one process per answer)
  writes its most recently used RAM-only entry when it is closed, so the next
  process can continue that conversation (:meth:`AdmissionPolicy.write_back`).

States of sliding-window models cannot be trimmed (llama.cpp saves only the
in-window cells of SWA layers), so for them a longer entry never serves a
shorter prefix, and nothing is replaced by a longer state. Each of their
states carries its window (Gemma 3 270M: 512 cells of 15 layers, about 8 MB,
more than a turn's own KV), so writing every turn's save point would write a
window per turn. For them (:meth:`AdmissionPolicy.defers`, a write-behind
policy like a page cache's dirty expiry):

* the save point that ends the system prompt (the prefix conversations share)
  is written through, as above;
* a conversation's later save points (``interim``: the previous turn's end,
  the context checkpoints) wait :data:`INTERIM_WRITE_DELAY_S` in RAM. A longer
  save point of the same chain stored before then supersedes them
  (:meth:`AdmissionPolicy.superseded_by`): they stay in RAM as RAM-only states
  (in this process a checkpoint still serves a prompt that shares only part
  of the conversation), but are not written. A conversation therefore reaches
  the disk once per pause, as its newest save point; one that continues after
  a pause deletes the interim file it wrote then. A deferred write is queued
  when it is due, when the RAM tier evicts the entry, and when the cache
  closes (a server's shutdown, a model's unload), so only a crash loses it.
* a RAM-only state that a request continued from whole gives way to that
  request's finished state (:meth:`AdmissionPolicy.continued_by`): one window
  per conversation in RAM, not one per turn; a deferred write it carried
  moves to the finished state when it was restored from the cache.
"""
from __future__ import annotations

from dataclasses import dataclass

from ollapy.cache.index import BlockIndex
from ollapy.cache.tiers import Entry

NEAR_TOKENS = 16
"""Tokens within which a longer state of a sliding-window model adds nothing to a held prefix of it
(:meth:`AdmissionPolicy.near_prefix`): the prompt planner's ``MIN_GAIN`` (``ollapy.engine.prefix.planner``), the
fewest tokens a restore must save."""
WRITE_BACK_NEWEST = 1  # RAM-only states a write_back cache writes when closed: the most recently used one
INTERIM_WRITE_DELAY_S = 60.0
"""Seconds an interim save point of a sliding-window model waits for a longer one of its chain before it is written
(an agent's or a chat's next turn usually comes sooner; a crash loses at most this much of a conversation)."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """Pure decisions over an index of :class:`~ollapy.cache.tiers.Entry`: ``block`` tokens per index block,
    ``trimmable`` False for sliding-window models (states serve only whole)."""

    block: int
    trimmable: bool = True

    def covering(self, index: BlockIndex, tokens: list[int]) -> list[Entry]:
        """Entries that can serve ``tokens`` whole: longer ones too when states can be trimmed."""
        covering = index.covering(tokens)
        if not self.trimmable:
            covering = [e for e in covering if len(e.tokens) == len(tokens)]
        return covering

    def already_kept(self, index: BlockIndex, tokens: list[int], persist: bool) -> list[Entry]:
        """Entries that make a new state of ``tokens`` redundant (empty: store it).

        A persisted entry always counts; a RAM-only one only while it holds its
        payload and the new state would not be written through (``persist``).
        """
        return [e for e in self.covering(index, tokens)
                if e.persisted or (not persist and e.payload is not None)]

    def near_prefix(self, index: BlockIndex, tokens: list[int]) -> Entry | None:
        """On a model whose states serve only whole: a held entry (in RAM or persisted) that is a strict prefix of
        ``tokens`` shorter by fewer than :data:`NEAR_TOKENS`, the longest such; None elsewhere.

        A state of ``tokens`` would serve no prompt that this entry does not serve with fewer than
        ``NEAR_TOKENS`` more tokens to prefill, which no restore is planned for (the planner's ``MIN_GAIN``): a
        save point just past a finished state (the previous answer's end-of-turn markers) is such a state.
        """
        if self.trimmable:
            return None
        near = [e for e in index.covered_by(tokens)
                if len(tokens) - NEAR_TOKENS < len(e.tokens) < len(tokens) and not e.refused
                and (e.payload is not None or e.persisted)]
        return max(near, key=lambda e: len(e.tokens), default=None)

    def replaced_by(self, index: BlockIndex, tokens: list[int], persist: bool, pinned: bool = False) -> list[Entry]:
        """Entries a new state of ``tokens`` makes redundant: strict prefixes that are no more durable than it."""
        if not self.trimmable:
            return []
        return [r for r in index.covered_by(tokens)
                if (pinned or not r.pinned) and (persist or not r.persisted)]

    def defers(self, e: Entry) -> bool:
        """True when ``e``'s disk write waits (write-behind): an interim save point of a model whose states serve
        only whole."""
        return not self.trimmable and e.interim and not e.pinned

    def superseded_by(self, index: BlockIndex, tokens: list[int]) -> list[Entry]:
        """The deferred writes a new save point of ``tokens`` makes unnecessary on a model whose states serve only
        whole: its strict prefixes still waiting (:attr:`Entry.due`), unpinned. They stay in RAM as RAM-only
        states (a checkpoint still serves a prompt that shares only part of the conversation, as llama.cpp's
        ``--ctx-checkpoints`` do), but are not written. Empty for trimmable models (there a longer state serves
        the shorter prefix too: :meth:`replaced_by`)."""
        if self.trimmable:
            return []
        return [r for r in index.covered_by(tokens) if r.due > 0 and not r.pinned]

    def continued_by(self, index: BlockIndex, tokens: list[int]) -> list[Entry]:
        """On a model whose states serve only whole: the RAM-only strict prefixes of a finished state of ``tokens``
        that a request continued from whole (:attr:`Entry.continued`), so that the new state takes their role;
        empty elsewhere (a trimmable model's longer state serves them already: :meth:`replaced_by`).

        Each of them holds a window, and serves only a prompt that contains all of it: after its conversation
        went on, that is the same conversation with its last turn regenerated or edited, which then prefills from
        the nearest context checkpoint instead (llama.cpp's server keeps a checkpoint per prompt end instead, and
        one window per turn). Kept: pinned and persisted ones, a state restored more than once (a branch point),
        and one its slot still holds with a deferred write (the conversation stayed in its slot, whose newest state
        is in RAM too): that write ends the pause, and moving it to the longer state would add a turn's blocks to
        each pause's write."""
        if self.trimmable:
            return []
        return [r for r in index.covered_by(tokens)
                if r.continued and not (r.on_disk or r.pending or r.pinned) and r.payload is not None
                and r.hits <= 1 and not (r.continued == "slot" and r.due > 0)]

    def worth_promoting(self, index: BlockIndex, e: Entry, n_used: int) -> bool:
        """True when RAM-only ``e``, which just served ``n_used`` tokens, offers a block more than persisted entries."""
        _, n_disk = index.best(e.tokens[:n_used], accept=lambda x: x.persisted and x is not e and (
            self.trimmable or len(x.tokens) <= n_used))  # an untrimmable state serves only whole
        return n_used - n_disk >= self.block

    def write_back(self, index: BlockIndex, entries: list[Entry], newest: int | None) -> list[Entry]:
        """RAM-only entries to write at close, longest first: those no persisted entry covers.

        ``newest``: only the ``newest`` most recently used of them (None: all).
        """
        todo = [e for e in entries
                if not (e.persisted or e.payload is None or e.superseded)
                and not any(c.persisted for c in self.covering(index, e.tokens) if c is not e)]
        if newest is not None:
            todo = sorted(todo, key=lambda x: x.last_used, reverse=True)[:newest]
        return sorted(todo, key=lambda x: len(x.tokens), reverse=True)
