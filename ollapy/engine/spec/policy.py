"""Batch-aware drafting policy: how many drafted tokens each decoding slot verifies in this step (0 = none).

Why. Verifying ``k`` drafted tokens adds ``k`` rows to the step's single ``llama_decode``. With one slot
decoding, the step is bound by reading the weights and extra rows are nearly free; with several slots the
rows compete for the same compute and every slot's step gets longer. llama.cpp measured exactly this for
its server's lookup decoding (PR #6828): 1.10x with 1 slot, 0.86x with 4 busy slots, 0.77x with 8.

Model. Two measurements:

- **Acceptance** per slot, ``a``: the probability that a drafted token is accepted given the previous one
  was, estimated from the slot's recent verifications (:class:`AcceptanceHistory`: accepted tokens count
  as successes, a verification that ended in a rejection as one failure; a Beta(2, 1) prior so that a new
  slot tries drafting). Under the geometric model of Leviathan et al. 2023 (Section 3.1) a slot that
  verifies ``k`` drafted tokens emits ``1 + a + ... + a^k`` tokens in expectation, so its ``j``-th drafted
  token adds ``a^j``.
- **Step time** as a function of the rows in the batch, ``t(rows)`` (:class:`StepCost`): the median of the
  engine's recent steps of exactly that many rows once at least :data:`MIN_SAMPLES` were measured, else a
  least-squares line fitted to all recent steps (before two distinct batch sizes were measured, a prior of
  ``t(rows) = 1 + 0.3 * (rows - 1)`` in units of a one-row step). The table matters because the cost is not a
  line on a CPU: one row goes to ``vec_dot`` and more rows to tinyBLAS, whose tiles take a fixed number of batch
  rows at a time (4 with AVX-512, 2 with AVX2: ``mnpack`` in llama.cpp's ``llamafile/sgemm.cpp``), so a row
  that starts a new tile costs a pass over the weights of its own; a line through such points would draft 1
  token where 3 are as cheap. ``scripts/measure_row_cost.py`` prints the curve; docs/benchmarks.md has figures.
- With a **draft model** each drafted token also costs the draft model's decoding, timed apart from the
  target's steps and added per drafted row (:class:`ModelDraftCost`; Leviathan et al.'s cost coefficient ``c``).

Rule. Start from no drafts: ``rows = n_decoding + n_other_rows`` (prefill rows in the same step),
``tokens = n_decoding`` (one per decoding slot), throughput ``tokens / t(rows)``. Repeatedly add the draft
block with the largest expected tokens per row among all slots: a slot's first block is ``n_min`` tokens
(``draft_min``; shorter drafts are not worth a verification) with gain ``a + ... + a^n_min``, each later
block one token with gain ``a^(k+1)``, never past the slot's ``available`` tokens. Gains per row only
fall, so after each addition the plan is the best one of its size; keep the plan with the highest
throughput ``tokens / t(rows)``, and draft at all only when it beats no drafting by ``min_gain`` (3% by
default: drafting must not cost when it does not help, and the estimates are noisy). Gains only fall along a
proposal, so one slot alone never drafts when its first token's probability is below
:func:`break_even_gain` (a bound computed once per cost table): the engine then skips pricing the rest of the
proposal, which on free text is most steps.

Consequences (tests/test_draft_policy.py): with the prior costs one slot at acceptance 0.8 drafts 3
tokens, four such slots 1 each, eight none; with a row costing half a one-row step, one slot at 0.8 drafts 2
and four slots draft only at 0.9 and above; a slot
whose acceptance falls stops drafting while the others go on. A slot that
stops drafting keeps learning from *shadow* verdicts (:class:`ShadowVerdict`, :func:`shadow_accepted`: a
draftless proposal compared with the tokens the slot then generated), so it resumes when its text starts repeating again.
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

#: Beta prior of the acceptance estimate: pseudo-successes, pseudo-failures (a new slot starts at 2/3).
PRIOR_ACCEPTED, PRIOR_REJECTED = 2.0, 1.0
#: Slope of the prior step-time line, in one-row steps per extra row.
PRIOR_ROW_COST = 0.5
#: How much a plan must beat no drafting by (relative throughput) to be taken (plan_draft_lengths).
MIN_GAIN = 0.03


class AcceptanceHistory:
    """A slot's recent verifications, for its per-token acceptance rate.

    ``window``: how many verifications (or shadow verdicts) are kept; older ones are forgotten, so the
    estimate follows the text (a copied passage ends, free text begins). Raises ValueError for window < 1.
    """

    def __init__(self, window: int = 16) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._events: deque[tuple[int, int]] = deque(maxlen=window)

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """One verification: ``n_accepted`` of ``n_drafted`` tokens kept (0 <= n_accepted <= n_drafted).
        A verification of 0 tokens is ignored. Raises ValueError for counts out of range."""
        if not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted} of {n_drafted}")
        if n_drafted:
            self._events.append((n_drafted, n_accepted))

    def clear(self) -> None:
        """Forget everything (a new request in the slot)."""
        self._events.clear()

    def rate(self) -> float:
        """Estimated probability in (0, 1) that a drafted token is accepted, given its predecessor was."""
        accepted = sum(a for _, a in self._events)
        rejected = sum(1 for d, a in self._events if a < d)
        return (accepted + PRIOR_ACCEPTED) / (accepted + rejected + PRIOR_ACCEPTED + PRIOR_REJECTED)

    def totals(self) -> tuple[int, int]:
        """(drafted, accepted) tokens over the window."""
        return sum(d for d, _ in self._events), sum(a for _, a in self._events)


class ContextRates:
    """A slot's learned acceptance of n-gram-drafted tokens whose context the history cannot judge: one that
    never occurred (``NOVEL``) or occurred once (``ONCE``; see ngram_draft.NgramDrafter.contexts), separately
    for a proposal's first token and its later ones (the first continues the slot's own text, where a lookup
    fails most: after a number, whose next digit no earlier line predicts; later ones continue a copy).

    Each rate is a Beta posterior (prior: ``NOVEL`` 1/3, ``ONCE`` 1/2) over the tokens verified so far, older
    verdicts decaying by ``decay`` per verification so the rate follows the text (a copied passage ends, free
    text begins). Copying a paragraph teaches ``ONCE`` ~1 within a few verifications; free text teaches both ~0.
    """

    # kind -> (accepted, verified) pseudo-counts (NOVEL, ONCE). Doubtful on purpose: free text (task (c)) drafted
    # half as much at twice the precision as with 1/2 and 2/3, and a copy raises ONCE within a few verdicts
    PRIORS = {0: (1.0, 3.0), 1: (1.0, 2.0)}

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self._counts: dict[tuple[int, bool], list[float]] = {}
        self.clear()

    def clear(self) -> None:
        """Back to the priors (a new request)."""
        self._counts = {(kind, first): list(prior) for kind, prior in self.PRIORS.items() for first in (True, False)}

    def rate(self, kind: int, first: bool) -> float:
        """Estimated probability in (0, 1) that a token of ``kind`` (a proposal's ``first`` or a later one) is
        accepted, given its predecessors were. KeyError for a kind without a learned rate (SEEN)."""
        a, n = self._counts[(kind, first)]
        return a / n

    def survival(self, contexts: Sequence[tuple[int, float]]) -> list[float]:
        """Cumulative acceptance probabilities of a proposal whose tokens have ``contexts`` (``(kind,
        estimate)`` per token, as NgramDrafter.contexts gives): element ``j`` estimates that tokens 0..j are all
        accepted. The estimate is used where the history judged the context, the kind's rate elsewhere."""
        p, out = 1.0, []
        for j, (kind, est) in enumerate(contexts):
            c = self._counts.get((kind, j == 0))
            p *= c[0] / c[1] if c is not None else est
            out.append(p)
        return out

    def record(self, kinds: Sequence[int], n_accepted: int) -> None:
        """A verdict on a proposal whose tokens had ``kinds``: the first ``n_accepted`` accepted, the next (if
        any) rejected, the rest never judged. Raises ValueError when n_accepted is out of range."""
        if not 0 <= n_accepted <= len(kinds):
            raise ValueError(f"need 0 <= n_accepted <= {len(kinds)}, got {n_accepted}")
        for c in self._counts.values():
            c[0] *= self.decay
            c[1] *= self.decay
        for j, kind in enumerate(kinds[:n_accepted + 1]):
            c = self._counts.get((kind, j == 0))
            if c is not None:
                c[1] += 1.0
                c[0] += j < n_accepted


def shadow_accepted(proposal: Sequence[int], generated: Sequence[int]) -> int:
    """How many tokens of a proposal that was not verified the slot then generated anyway: the length of
    the common prefix of ``proposal`` and ``generated`` (what verification would have accepted)."""
    n = 0
    for p, g in zip(proposal, generated):
        if p != g:
            break
        n += 1
    return n


class VerdictSink(Protocol):
    """Where a verdict goes: ``n_accepted`` of ``n_drafted`` proposed tokens were (or would have been) kept."""

    def record(self, n_drafted: int, n_accepted: int) -> None: ...


class ShadowVerdict:
    """Learns a non-drafting slot's acceptance from proposals it did not verify (see the module docstring).

    :meth:`start` with the proposal a slot would have verified (when the policy gave it 0 rows), then
    :meth:`observe` each token the slot generates; on the first mismatch, or once the whole proposal matched,
    the verdict goes into ``history`` as if it had been verified. A new :meth:`start` while one is pending
    replaces it (nothing recorded).
    """

    def __init__(self, history: VerdictSink) -> None:
        self.history = history
        self._proposal: list[int] = []
        self._matched = 0

    @property
    def pending(self) -> bool:
        """True while a proposal is being compared with the generated tokens."""
        return bool(self._proposal)

    def start(self, proposal: Sequence[int]) -> None:
        """Compare ``proposal`` with the tokens generated from now on."""
        self._proposal = list(proposal)
        self._matched = 0

    def observe(self, token: int) -> None:
        """One generated token; records the verdict when it decides it."""
        if not self._proposal:
            return
        if token == self._proposal[self._matched]:
            self._matched += 1
            if self._matched < len(self._proposal):
                return
        self.history.record(len(self._proposal), self._matched)
        self._proposal = []


#: Steps of one row count needed before their median replaces the line for that count.
MIN_SAMPLES = 3


@dataclass(frozen=True)
class StepCost:
    """Step time by the batch's rows: the median of measured steps of that row count (``measured``), else the
    line ``t(rows) = base + per_row * rows`` (seconds, or any unit)."""

    base: float
    per_row: float
    measured: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def prior(cls) -> StepCost:
        """The prior line, in units of a one-row step (see the module docstring)."""
        return cls(1.0 - PRIOR_ROW_COST, PRIOR_ROW_COST)

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, float]]) -> StepCost:
        """Median per row count (those with at least :data:`MIN_SAMPLES` steps) plus a least-squares line
        through all measured ``(rows, seconds)`` steps for the other counts.

        The line falls back to :meth:`prior` scaled to the measured mean when fewer than two distinct row
        counts were measured; its slope is clamped at 0 (noise can make it negative) and its intercept at a
        small positive value. Rows must be >= 1; non-positive durations are skipped.
        """
        pts = [(int(r), float(s)) for r, s in samples if r >= 1 and s > 0]
        by_rows: dict[int, list[float]] = {}
        for r, s in pts:
            by_rows.setdefault(r, []).append(s)
        measured = {r: statistics.median(v) for r, v in by_rows.items() if len(v) >= MIN_SAMPLES}
        if len(by_rows) < 2:
            if not pts:
                return cls.prior()
            one = sum(s / (1 + PRIOR_ROW_COST * (r - 1)) for r, s in pts) / len(pts)  # implied one-row time
            return cls(one * (1 - PRIOR_ROW_COST), one * PRIOR_ROW_COST, measured)
        n = len(pts)
        mr = sum(r for r, _ in pts) / n
        ms = sum(s for _, s in pts) / n
        var = sum((r - mr) ** 2 for r, _ in pts)
        slope = max(0.0, sum((r - mr) * (s - ms) for r, s in pts) / var)
        base = max(ms - slope * mr, 1e-3 * ms)
        return cls(base, slope, measured)

    def time(self, rows: int) -> float:
        """Predicted duration of a step of ``rows`` rows: the measured median when there is one; else the
        line's value, but no more than the largest smaller batch measured plus the prior's relative price of
        the extra rows. That cap lets the planner find a cheap batch size the line cannot see (a CPU's tiled
        kernels can make 4 rows cost what 3 do, where a line through 1, 2, 3 and 5 rows makes 4 dear) at a price that still
        needs a good proposal; the real cost replaces it after :data:`MIN_SAMPLES` steps."""
        m = self.measured.get(rows)
        if m is not None:
            return m
        line = self.base + self.per_row * rows
        below = max((r for r in self.measured if r < rows), default=0)
        if not below:
            return line
        return min(line, self.measured[below] * (1.0 + PRIOR_ROW_COST * (rows - below) / below))


class StepTimer(Protocol):
    """What the planner needs of a cost model: the predicted seconds of a step of ``rows`` batch rows."""

    def time(self, rows: int) -> float: ...


#: a draft model's price per drafted token, in target one-row steps, until its decodes were timed (the dearest
#: draft that can still pay with a good acceptance: 2 drafted rows at 1 + 2 * 0.5 steps)
PRIOR_DRAFT_COST = 0.5


@dataclass(frozen=True)
class ModelDraftCost:
    """A step's time when a draft model drafts its extra rows (Leviathan et al. 2023's cost coefficient ``c`` is
    ``per_token / target.time(1)``): the target's step, ``target.time(rows)``, plus ``per_token`` seconds of
    draft-model decoding per row beyond ``base_rows`` (the step's rows without drafts: one per decoding slot and
    the other work). The draft model decodes its drafted positions one ``llama_decode`` each, for all its slots
    at once, so with several slots this overprices (a conservative plan)."""

    target: StepCost
    per_token: float
    base_rows: int

    def time(self, rows: int) -> float:
        """Predicted seconds of a step of ``rows`` rows, drafting included."""
        return self.target.time(rows) + self.per_token * max(0, rows - self.base_rows)


@dataclass(frozen=True)
class SlotDraft:
    """One decoding slot's input to :func:`plan_draft_lengths`.

    ``available``: drafted tokens it could verify now (its proposal's length, already capped by
    ``draft_num_predict``, the context left and ``num_predict``; 0 = none). ``acceptance``: its
    :meth:`AcceptanceHistory.rate`. ``survival`` (optional, ``available`` non-increasing values in [0, 1]):
    per-token estimates instead of the geometric model (n-gram drafting: ngram_draft.NgramDrafter.confidences).
    """

    available: int
    acceptance: float
    survival: Sequence[float] = ()

    def gain(self, j: int) -> float:
        """Expected tokens that the ``j``-th drafted token (1-based) adds: ``survival[j - 1]`` (the probability
        that tokens 1..j are all accepted) when given, else ``acceptance ** j`` (the geometric model)."""
        return self.survival[j - 1] if self.survival else self.acceptance ** j


def plan_draft_lengths(slots: Sequence[SlotDraft], cost: StepTimer, n_min: int = 1, n_other_rows: int = 0,
                       min_gain: float = MIN_GAIN) -> list[int]:
    """Draft length for every decoding slot in this step (the rule in the module docstring).

    ``slots``: every slot that decodes in this step, drafting or not. ``n_other_rows``: rows of other work in
    the same batch (prefill chunks). ``n_min``: ``draft_min`` (>= 1). Returns one length per slot, each 0 or
    in ``[n_min, available]``. Raises ValueError for n_min < 1 or an acceptance outside [0, 1].
    """
    if n_min < 1:
        raise ValueError(f"n_min must be at least 1, got {n_min}")
    for s in slots:
        if not 0.0 <= s.acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {s.acceptance}")
        if s.survival and len(s.survival) < s.available:
            raise ValueError(f"survival needs {s.available} values, got {len(s.survival)}")
    lengths = [0] * len(slots)
    rows = len(slots) + n_other_rows
    if not slots or rows == 0:
        return lengths
    tokens = float(len(slots))
    base_tput = tokens / cost.time(rows)
    best_tput, best = base_tput, list(lengths)
    while True:
        pick, pick_rows, pick_gain, pick_ratio = -1, 0, 0.0, 0.0
        for i, s in enumerate(slots):
            k = lengths[i]
            if k == 0:
                if s.available < n_min:
                    continue
                add = n_min
                gain = sum(s.gain(j) for j in range(1, n_min + 1))
            elif k < s.available:
                add = 1
                gain = s.gain(k + 1)
            else:
                continue
            if gain / add > pick_ratio:
                pick, pick_rows, pick_gain, pick_ratio = i, add, gain, gain / add
        if pick < 0:
            break
        lengths[pick] += pick_rows
        rows += pick_rows
        tokens += pick_gain
        tput = tokens / cost.time(rows)
        if tput > best_tput:
            best_tput, best = tput, list(lengths)
    return best if best_tput >= base_tput * (1.0 + min_gain) else [0] * len(slots)


def break_even_gain(cost: StepTimer, n_min: int, available: int, min_gain: float = MIN_GAIN) -> float:
    """The smallest first-token gain (``SlotDraft.gain(1)``: the probability that a proposal's first token is
    accepted) with which :func:`plan_draft_lengths` could draft for ONE slot alone in its step (no other rows)
    with up to ``available`` tokens of at least ``n_min``; ``inf`` when no length is possible.

    Why it is exact: gains only fall along a proposal (``gain(j) <= gain(1)``), so ``k`` drafted tokens yield at
    most ``1 + k * gain(1)`` tokens in a step of ``1 + k`` rows, and the plan drafts only when some ``k`` reaches
    ``(1 + min_gain) * t(1 + k) / t(1)`` tokens. Hence a first-token gain below
    ``min over k of ((1 + min_gain) * t(1 + k) / t(1) - 1) / k`` means the plan is no drafting, and the engine
    can skip pricing the rest of the proposal (every step of free text). O(available) calls of ``cost.time``.
    """
    if n_min < 1:
        raise ValueError(f"n_min must be at least 1, got {n_min}")
    one = cost.time(1)
    need = 1.0 + min_gain
    return min((((need * cost.time(1 + k) / one) - 1.0) / k for k in range(n_min, available + 1)),
               default=float("inf"))
