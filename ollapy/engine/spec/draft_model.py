"""A draft model's context, kept in step with the target's slots, that drafts greedily for several slots at once.

Speculative decoding with a draft model (Leviathan et al. 2023; llama.cpp's ``common/speculative.cpp``
"draft-simple" and llama-server's ``-md``; Ollama's Modelfile ``DRAFT``): a smaller model of the same
vocabulary proposes the next tokens, the target verifies them in one step. Here the draft model has its own
:class:`~.backend.context.Backend` (one ``llama_context``) with one sequence per target slot (seq ``i`` drafts
for slot ``i``), and this class keeps each sequence's KV equal to a prefix of that slot's tokens:

- :meth:`DraftModel.propose` takes each slot's current tokens (prompt plus accepted output). For each slot it
  keeps the longest common prefix of what the draft sequence holds and those tokens (at most all but the last
  token, whose logits are needed), removes the rest with ``seq_rm`` (rejected draft tokens, a new request's
  prompt, a prefix-cache restore in the target: all just a different token list), evaluates the missing
  tokens of every slot in one batch, then decodes greedily, one batch per drafted position for all slots
  still drafting. The last drafted token is never evaluated (nothing would read its logits), so afterwards a
  sequence holds its tokens plus all but the last of its draft.
- A slot's step costs the tokens it added since the last one, not its whole context: the engine passes its
  token list as a :class:`PendingTokens` view (no copy), and while a sequence is *followed*
  (:meth:`DraftModel.follow`, from the start of a request to its end: the slot's tokens only grow, a context
  shift is mirrored apart) the common prefix is searched from where the last step left it. An unfollowed
  sequence (a direct caller) compares from the start.
- :meth:`DraftModel.shift` mirrors a target context shift (keep ``n_keep``, drop ``n_discard``, shift the
  rest down) with ``seq_rm`` + ``seq_add``, so that no re-prefill follows; if the draft context cannot shift
  it clears the sequence and the next :meth:`propose` prefills it.

The vocabularies are checked when the class is built (:func:`~.backend.vocab.check_draft_vocab`). A draft with a
trimmed vocabulary (FR-Spec, Zhao et al. 2025: its output layer keeps only the target's most frequent tokens, the
layer that dominates a small model's step) comes with ``token_ids``, the target id of each draft token: the
draft context is fed the draft's ids (a token outside the subset as ``token_map.unknown``) and its argmax is
mapped back, so that everything outside this class sees target ids only. Draft tokens
are the draft model's argmax, a point-mass draft: the target verifies them with
:func:`~.spec_sampling.verify_by_sampling` (or :func:`~.spec_sampling.verify_greedy` at temperature 0).
Called from the engine's loop thread only, like the target's backend.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ollapy.engine.backend.vocab import check_draft_vocab
from ollapy.store.draft_vocab import TokenMap

if TYPE_CHECKING:
    from ollapy.engine.backend.context import Backend


@dataclass
class DraftStats:
    """Work done by the draft context: tokens evaluated to catch up with the slots (``synced``), drafted
    tokens evaluated (``drafted``), ``llama_decode`` calls, and sequences cleared for lack of a partial
    ``seq_rm`` or a shift (``cleared``)."""

    synced: int = 0
    drafted: int = 0
    decodes: int = 0
    cleared: int = 0
    compared: int = 0  # tokens compared to find a sequence's common prefix with its slot's tokens


class PendingTokens(Sequence[int]):
    """A slot's token list with its pending token after it, as a read-only view (no copy of the context per
    step): ``len``, indexing and slicing (a slice is a new list)."""

    __slots__ = ("base", "pending")

    def __init__(self, base: list[int], pending: int) -> None:
        self.base = base
        self.pending = pending

    def __len__(self) -> int:
        return len(self.base) + 1

    def __getitem__(self, i):
        n = len(self.base)
        if isinstance(i, slice):
            start, stop, step = i.indices(n + 1)
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            return self.base[start:min(stop, n)] + ([self.pending] if stop > n >= start else [])
        if i < 0:
            i += n + 1
        if i == n:
            return self.pending
        if not 0 <= i < n:
            raise IndexError(i)
        return self.base[i]


class DraftModel:
    """Greedy drafting from a draft model's context, one sequence per target slot (see the module docstring).

    ``draft``: a loaded Backend of the draft model with ``n_parallel`` >= the target's and the same
    ``num_ctx``; ``target``: the target's Backend (only its vocabulary is read); ``token_map``: a
    trimmed-vocabulary draft's map (``draft.n_vocab`` target ids), None for a draft of the same vocabulary.
    Raises DraftMismatch when the vocabularies differ (one line naming ``target_name`` and ``draft_name``).
    """

    def __init__(self, draft: Backend, target: Backend, target_name: str, draft_name: str,
                 token_map: TokenMap | None = None) -> None:
        check_draft_vocab(target, draft, target_name, draft_name, token_map.ids if token_map else None)
        self.backend = draft
        self.n_vocab = min(draft.n_vocab, target.n_vocab)  # never propose an id the target does not have
        # target id -> draft id (out of the subset: token_map.unknown) and back; None: the same ids
        self._to_draft: np.ndarray | None = None
        self._to_target: np.ndarray | None = None
        if token_map is not None:
            self.n_vocab = draft.n_vocab
            self._to_target = np.asarray(token_map.ids, dtype=np.int32)
            self._to_draft = np.full(target.n_vocab, token_map.unknown, dtype=np.int32)
            self._to_draft[self._to_target] = np.arange(draft.n_vocab, dtype=np.int32)
        self._held: list[list[int]] = [[] for _ in range(draft.n_parallel)]
        # seq -> length of the prefix of its slot's tokens known equal to what it holds (followed seqs only)
        self._known: dict[int, int] = {}
        self.stats = DraftStats()
        # decode threads for a batch of n tokens (the engine sets its ThreadBudget's: fewer threads while other
        # processes keep the CPUs busy, as for the target; a spinning ggml barrier on an oversubscribed CPU made
        # a draft step take seconds); None: the backend's own count
        self.thread_count: Callable[[int], int] | None = None

    def held(self, seq: int) -> list[int]:
        """The tokens whose KV sequence ``seq`` holds (a copy)."""
        return list(self._held[seq])

    def reset(self, seq: int) -> None:
        """Empty sequence ``seq`` (its slot was freed)."""
        self.backend.seq_clear(seq)
        self._held[seq] = []
        if seq in self._known:
            self._known[seq] = 0

    def follow(self, seq: int) -> None:
        """From now until :meth:`unfollow`, the tokens given for ``seq`` only grow between steps (a request's
        tokens; a context shift goes through :meth:`shift`): each step then compares only the new ones. The
        first step after this compares from the start (a new request may share a prefix with the last one)."""
        self._known[seq] = 0

    def unfollow(self, seq: int) -> None:
        """``seq``'s request ended: its next tokens may be any list again."""
        self._known.pop(seq, None)

    def shift(self, seq: int, n_keep: int, n_discard: int) -> None:
        """Mirror the target's context shift of slot ``seq``: drop positions ``[n_keep, n_keep + n_discard)``
        and move the rest down by ``n_discard``."""
        held = self._held[seq]
        if not self.backend.can_shift or not self.backend.seq_rm(seq, n_keep, n_keep + n_discard):
            self.reset(seq)
            self.stats.cleared += 1
            return
        self.backend.seq_add(seq, n_keep + n_discard, -1, -n_discard)
        self._held[seq] = held[:n_keep] + held[n_keep + n_discard:]
        if seq in self._known:
            self._known[seq] = min(self._known[seq], n_keep)

    def _trim(self, seq: int, tokens: Sequence[int]) -> int:
        """Cut sequence ``seq`` to its common prefix with ``tokens`` minus the last token; returns its length.
        A followed sequence compares from the prefix the last step left known (:meth:`follow`)."""
        held = self._held[seq]
        limit = min(len(held), len(tokens) - 1)
        n = min(self._known.get(seq, 0), limit)
        start = n
        while n < limit and held[n] == tokens[n]:
            n += 1
        self.stats.compared += n - start + (n < limit)
        if n < len(held):
            if not self.backend.seq_rm(seq, n, -1):
                self.backend.seq_clear(seq)
                self.stats.cleared += 1
                n = 0
            del held[n:]
        return n

    def propose(self, requests: Mapping[int, tuple[Sequence[int], int]]) -> dict[int, list[int]]:
        """Greedy drafts: ``{seq: (tokens, n_max)}`` -> ``{seq: up to n_max draft tokens}``.

        ``tokens``: slot ``seq``'s prompt plus accepted tokens (at least one). ``n_max`` is cut so that
        positions stay below ``num_ctx``; a seq with ``n_max`` < 1 gets ``[]`` and is only synced. Raises
        DecodeError when ``llama_decode`` fails (the sequences involved are then reset).
        """
        b = self.backend
        out: dict[int, list[int]] = {}
        pending: dict[int, list[int]] = {}
        want: dict[int, int] = {}
        for seq, (tokens, n_max) in requests.items():
            if not tokens:
                raise ValueError(f"seq {seq}: nothing to draft from (no tokens)")
            kept = self._trim(seq, tokens)
            pending[seq] = list(tokens[kept:])
            out[seq] = []
            want[seq] = max(0, min(n_max, b.num_ctx - len(tokens)))
            if seq in self._known:  # after this step it holds all of ``tokens``: the next step's prefix
                self._known[seq] = len(tokens)
        try:
            firsts = self._catch_up(pending, {s for s, n in want.items() if n > 0})
            for s, t in firsts.items():
                out[s].append(t)
            active = [s for s in firsts if len(out[s]) < want[s]]
            while active:
                toks, pos, seqs = array("i"), array("i"), array("i")
                for s in active:
                    toks.append(out[s][-1])
                    pos.append(len(self._held[s]))
                    seqs.append(s)
                self._decode(toks, pos, seqs, array("b", [1]) * len(active))
                self.stats.decodes += 1
                self.stats.drafted += len(active)
                for i, s in enumerate(active):
                    self._held[s].append(out[s][-1])
                    out[s].append(self._argmax(i))
                active = [s for s in active if len(out[s]) < want[s]]
        except Exception:
            for s in requests:
                self.reset(s)
            raise
        return out

    def _catch_up(self, pending: dict[int, list[int]], drafting: set[int]) -> dict[int, int]:
        """Evaluate every seq's missing tokens, in batches of at most ``n_batch`` (logits only for each seq's
        last token); returns the first draft token of each seq in ``drafting``, read right after the batch
        that held its last token (the next batch overwrites the logits)."""
        b = self.backend
        entries = [(s, t, k == len(toks) - 1) for s, toks in pending.items() for k, t in enumerate(toks)]
        firsts: dict[int, int] = {}
        for i in range(0, len(entries), b.n_batch):
            chunk = entries[i:i + b.n_batch]
            toks, pos, seqs, logits = array("i"), array("i"), array("i"), array("b")
            rows: dict[int, int] = {}
            for s, t, last in chunk:
                if last and s in drafting:
                    rows[s] = len(toks)
                toks.append(t)
                pos.append(len(self._held[s]))
                seqs.append(s)
                logits.append(1 if last and s in drafting else 0)
                self._held[s].append(t)
            self._decode(toks, pos, seqs, logits)
            self.stats.decodes += 1
            self.stats.synced += len(chunk)
            for s, row in rows.items():
                firsts[s] = self._argmax(row)
        return firsts

    def _decode(self, toks: array, pos: array, seqs: array, logits: array) -> None:
        if self._to_draft is not None:
            toks = array("i", self._to_draft[np.frombuffer(toks, dtype=np.int32)].tobytes())
        if self.thread_count is not None:
            n = self.thread_count(len(toks))
            if n != self.backend.threads:
                self.backend.set_threads(n)
        self.backend.decode(toks, pos, seqs, logits)

    def _argmax(self, row: int) -> int:
        best = int(self.backend.logits_row(row)[: self.n_vocab].argmax())
        return best if self._to_target is None else int(self._to_target[best])
