"""Speculative decoding in the slot loop: who drafts, how many tokens, and what it earned.

One :class:`Speculator` per engine. For every decoding slot of a step it proposes drafted tokens (draftless
n-gram lookup, :mod:`~.ngram_draft`, or a draft model, :mod:`~.draft_model`), lets the batch-aware policy
(:mod:`~.draft_policy`) decide how many of them are worth verifying, and learns from the verdicts. The
engine then puts each slot's pending token and its drafted tokens as consecutive rows of the step's one
``llama_decode`` (so verification shares the decode with every other slot's row), samples row after row
with the slot's own sampler (:func:`~.spec_sampling.verify_by_sampling`: the point-mass case of the
speculative-sampling rule of Leviathan et al. 2023 / Chen et al. 2023), and removes the KV cells of rejected
rows with ``seq_rm``.

Why the output is exactly plain decoding's (temperature 0, and with a seed at any temperature). A slot's
sampler sees the same logits rows in the same order as without drafting, and stops at the first row whose
token differs from the draft, so it draws exactly the random numbers plain decoding draws. That holds when a
verified row's logits are bit-identical to a one-row decode step's: every row of a ubatch must be computed
by the same kernels whatever the batch. On the CPU that is the case when llamafile's tinyBLAS takes one-row
products too (llama.cpp's ``llamafile_sgemm`` declines ``n < 2``, so a row would round differently alone than
beside others; ``scripts/install_llama.sh`` patches the guard to ``n < 1``), weights are not repacked
(``extra_bufts`` off: repacked weights
multiply rows in groups of 4) and ggml-cpu's tiled K-quant matmul is off (``GGML_CPU_TILED_MM=0``: it takes
over from 8 rows up). :attr:`Speculator.row_invariant` reports it; ``extra_bufts=auto`` is off, and the
backend sets ``GGML_CPU_TILED_MM=0`` unless the environment says.

One ubatch per step. With one KV stream per slot llama.cpp splits a batch "equally" (``split_equal``: the
same number of rows for every sequence of a ubatch), so slots verifying drafts of different lengths would
cost extra ubatches, each reading all the weights again. When several slots decode, they all verify the same
number of drafted tokens (the smallest the policy gave any of them; none if one of them drafts nothing).

A draft model's price and probes. Its time per drafted token (the catch-up batch plus one decode per further
position) is measured per proposal and priced per drafted row beside the target's measured step times. Unlike
an n-gram proposal, a draft model's proposal is not free, so it has no shadow: a slot decoding alone that does
not draft with it probes ``draft_min`` tokens at its first step and after :data:`PROBE_STEPS` idle steps, the
wait doubling after each rejected probe (up to :data:`PROBE_MAX_STEPS`) and reset by an accepted one. It never
probes while the prices say that not even a proposal accepted in full could pay (``break_even_gain`` above 1:
on a CPU where each verified row costs nearly a whole step, the probes alone cost ~15% of the decode speed).
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ollapy.engine.spec.draft_model import DraftModel
from ollapy.engine.spec.ngram import NgramDrafter
from ollapy.engine.spec.policy import (
    MIN_SAMPLES,
    PRIOR_DRAFT_COST,
    AcceptanceHistory,
    ContextRates,
    ModelDraftCost,
    ShadowVerdict,
    SlotDraft,
    StepCost,
    StepTimer,
    break_even_gain,
    plan_draft_lengths,
)
from ollapy.options import draft_limit

log = logging.getLogger("ollapy.engine")

#: step times kept per row count (the policy's cost table: draft_policy.StepCost)
STEP_SAMPLES = 16
#: a row count not measured in this many steps is priced as unmeasured again (and re-measured from scratch when
#: the policy tries it): a price learned while the machine was busy must not stop drafting for good
STALE_STEPS = 128
#: tokens of a proposal scored as a shadow verdict: its verdict is known only once they were generated (or one
#: differed), so a long shadow teaches late (a slot copying a paragraph would wait many steps to draft)
SHADOW_TOKENS = 4
#: the step-time line is refitted at least every this many steps (and at once for a row count with few samples
#: or one going stale): fitting every step costs more than it learns
REFIT_STEPS = 8

#: a slot whose draft model the policy stopped trusting drafts ``n_min`` tokens after this many steps without
#: drafting (a probe), the wait doubling after each probe that is rejected up to PROBE_MAX_STEPS: a draft model
#: has no free shadow (its tokens cost a decode), and without probes one rejected first proposal (rate 2/3 -> 1/2,
#: under the break-even gain) stopped a slot drafting for good, though the same draft then kept nearly all its tokens
PROBE_STEPS, PROBE_MAX_STEPS = 8, 256

#: the draft modes a slot can be in: none, draftless n-gram lookup, a draft model
OFF, NGRAM, MODEL = "", "ngram", "model"


@dataclass
class SlotSpec:
    """One slot's drafting state for its current request.

    n-gram proposals are priced token by token: what the history says of each token's context
    (NgramDrafter.contexts) and, where it says nothing, the rates the slot learns (``rates``). A draft model's
    proposals are priced by the slot's acceptance ``history`` (the geometric model).
    """

    mode: str = OFF
    n_max: int = 0
    n_min: int = 1
    drafter: NgramDrafter = field(default_factory=lambda: NgramDrafter(max_ngram=4))
    history: AcceptanceHistory = field(default_factory=AcceptanceHistory)
    rates: ContextRates = field(default_factory=ContextRates)
    kinds: list[int] = field(default_factory=list)  # context kinds of the n-gram proposal planned last
    idle: int = 0  # draft model: steps since the slot last drafted
    probe_wait: int = PROBE_STEPS  # draft model: steps without drafting before a probe
    shadow: ShadowVerdict | None = None
    _shadow_kinds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shadow = ShadowVerdict(self)

    def clear(self) -> None:
        """Forget what was learned (a new request)."""
        self.idle, self.probe_wait = 0, PROBE_STEPS
        self.history.clear()
        self.rates.clear()
        self.shadow.start(())

    def start_shadow(self, proposal: Sequence[int]) -> None:
        """Learn from ``proposal`` (planned last, not verified) by comparing it with what the slot generates."""
        self._shadow_kinds = list(self.kinds)
        self.shadow.start(proposal)

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """A shadow verdict (VerdictSink; verified ones come through Speculator.record): into the acceptance
        history and, for an n-gram proposal, the context rates."""
        self.history.record(n_drafted, n_accepted)
        if self._shadow_kinds:
            self.rates.record(self._shadow_kinds[:n_drafted], n_accepted)


def _probe_due(st: SlotSpec) -> bool:
    """One more step in which ``st`` (drafting with a draft model) does not draft; True when it should probe."""
    st.idle += 1
    return st.idle >= st.probe_wait


@dataclass(frozen=True)
class Candidate:
    """A decoding slot as the planner sees it: ``tokens`` (prompt plus accepted output, the pending token
    last; only for a slot drafting with the draft model, else empty: n-gram drafters keep their own history) and
    ``room``: how many drafted tokens it may verify at most (context left, ``num_predict`` left)."""

    slot: int
    tokens: Sequence[int]
    room: int


class Speculator:
    """Per-slot drafting for ``n_slots`` slots; ``draft_model`` (optional) drafts for slots whose request
    names it. Used from the engine's loop thread only.

    ``row_invariant``: True when a verified row's logits equal a one-row step's (see the module docstring);
    drafting runs either way, but only then is its output bit-identical to plain decoding.
    """

    def __init__(self, n_slots: int, *, draft_model: DraftModel | None = None, draft_name: str = "",
                 row_invariant: bool = True) -> None:
        self.draft_model = draft_model
        self.draft_name = draft_name
        self.row_invariant = row_invariant
        self.slots = [SlotSpec() for _ in range(n_slots)]
        # rows -> the last STEP_SAMPLES (step number, seconds) of steps of that many rows
        self._steps: dict[int, deque[tuple[int, float]]] = {}
        self._step_no = 0  # steps observed by this engine (remembered ones count as step 0)
        self._measured_here: set[int] = set()  # row counts this engine measured itself
        self._cost = StepCost.prior()
        self._cost_stale = False
        self._cost_pinned = False
        self._refit_now = False  # a step whose row count had few samples: refit before the next plan
        self._fit_step = 0  # _step_no at the last fit
        self._fit_expires = STALE_STEPS + 1  # _step_no at which a fitted row count may have gone stale
        self._break_even: dict[tuple[int, int], float] = {}  # (n_min, available) -> break_even_gain for _cost
        # seconds of draft-model work per drafted token (its catch-up batch with the tokens accepted since, then
        # one llama_decode per further position), the last STEP_SAMPLES proposals': a drafted token's price
        # (ModelDraftCost), timed apart from the target's steps
        self._draft_token: deque[float] = deque(maxlen=STEP_SAMPLES)
        self.drafted = 0
        self.accepted = 0

    # ---- per request ----------------------------------------------------------------------------
    def begin(self, slot: int, prompt: Sequence[int], draft: str, n_max: int, n_min: int) -> str:
        """A request starts in ``slot``: its ``draft`` option (``""``, ``ngram`` or a draft model's name),
        ``draft_num_predict`` (``n_max``; negative: the mode's default, options.draft_limit) and ``draft_min``.
        Returns the mode it drafts in (OFF, NGRAM, MODEL)."""
        st = self.slots[slot]
        st.clear()
        mode = OFF
        n_max = draft_limit(draft, n_max)
        if n_max > 0 and draft:
            if draft == NGRAM:
                mode = NGRAM
            elif self.draft_model is not None:
                mode = MODEL
            else:
                log.warning("draft model %r is not loaded for this model; drafting off", draft)
        st.mode, st.n_max, st.n_min = mode, n_max, max(1, n_min)
        if mode == NGRAM:
            st.drafter.reset(prompt)  # its last NGRAM_WINDOW tokens
        elif mode == MODEL:
            st.idle = st.probe_wait  # nothing learned yet: the first step probes (PROBE_STEPS) if it would not draft
            follow = getattr(self.draft_model, "follow", None)  # optional: a drafter that keeps no prefix has none
            if follow is not None:
                follow(slot)  # the slot's tokens only grow from here: each step compares the new ones
        return mode

    def end(self, slot: int) -> None:
        """The slot's request ended: its n-gram index is freed, its draft sequence no longer followed."""
        st = self.slots[slot]
        if st.mode == NGRAM or len(st.drafter):
            st.drafter.reset(())
        unfollow = getattr(self.draft_model, "unfollow", None)
        if unfollow is not None:
            unfollow(slot)
        st.mode = OFF

    def accept(self, slot: int, token: int) -> None:
        """A token the slot generated (it joins the slot's history; a shadow verdict may be decided)."""
        st = self.slots[slot]
        if st.mode == NGRAM:
            st.drafter.extend((token,))
            st.shadow.observe(token)

    def sync_prompt(self, slot: int, prompt: Sequence[int]) -> None:
        """The target has just evaluated ``slot``'s whole prompt: evaluate it in the draft model's sequence too,
        as part of prompt processing (llama.cpp's ``speculative`` example encodes the prompt on both models
        before it starts timing generation), so the first drafting step does not pay for it. A failure turns
        drafting off for this request (logged) and never fails it."""
        st = self.slots[slot]
        if st.mode != MODEL or self.draft_model is None or not prompt:
            return
        try:
            self.draft_model.propose({slot: (prompt, 0)})
        except Exception:  # noqa: BLE001 - drafting is an optimisation: the request goes on without it
            log.warning("draft model could not evaluate the prompt of slot %d; drafting off", slot, exc_info=True)
            st.mode = OFF

    def uses_draft_model(self, slot: int) -> bool:
        """True while the slot's request drafts with the draft model (which needs the slot's whole token list)."""
        return self.slots[slot].mode == MODEL

    def drafting(self, slot: int) -> bool:
        """True while the slot's request drafts."""
        return self.slots[slot].mode != OFF

    @property
    def active(self) -> bool:
        """True when any slot drafts."""
        return any(st.mode != OFF for st in self.slots)

    # ---- per step -------------------------------------------------------------------------------
    def plan(self, decoding: Sequence[Candidate], n_other_rows: int = 0) -> dict[int, list[int]]:
        """The drafted tokens each decoding slot verifies in this step (absent: none).

        ``decoding``: every slot that puts a decode row into this step, drafting or not. ``n_other_rows``:
        other rows of the step (last prompt tokens). A draft model drafts here (its decodes run now).
        """
        proposals: list[list[int]] = []
        inputs: list[SlotDraft] = []
        alone = len(decoding) == 1 and n_other_rows == 0  # break_even_gain applies
        probe = False
        model_cost = self._model_cost(len(decoding) + n_other_rows) if any(
            self.slots[c.slot].mode == MODEL for c in decoding) else None
        for c in decoding:
            st = self.slots[c.slot]
            room = min(st.n_max, c.room)
            prop: list[int] = []
            avail = 0
            st.kinds = []
            survival: list[float] = []
            if st.mode == NGRAM and room >= st.n_min:
                prop = st.drafter.propose(room, st.n_min)
                avail = len(prop)
                if prop:
                    head = st.drafter.contexts(prop[:SHADOW_TOKENS])
                    if alone and st.rates.survival(head[:1])[0] < self._break_even_gain(st.n_min, avail) - 1e-9:
                        # no length can pay (free text, most steps): the same plan without pricing the rest
                        st.kinds = [kind for kind, _ in head]
                        if not st.shadow.pending:
                            st.start_shadow(prop[:SHADOW_TOKENS])
                        return {}
                    contexts = st.drafter.contexts(prop) if len(prop) > len(head) else head
                    st.kinds = [kind for kind, _ in contexts]
                    survival = st.rates.survival(contexts)
            elif st.mode == MODEL and room >= st.n_min:
                avail = room
                bound = break_even_gain(model_cost, st.n_min, avail) if alone else 0.0
                if bound > 1.0:
                    # not even a proposal accepted in full pays at these prices (rows as dear as a step, a draft
                    # a third of the target's: the 1.5B/0.5B pair on 2 cores), so a probe would only cost; the
                    # prices are re-learned when they go stale (STALE_STEPS) or the machine's load changes them
                    return {}
                if alone and st.history.rate() < bound - 1e-9:
                    if not _probe_due(st):
                        return {}
                    probe = True  # PROBE_STEPS: draft n_min tokens to learn whether the draft model pays now
            proposals.append(prop)
            inputs.append(SlotDraft(avail, st.history.rate(), survival))
        if not any(d.available for d in inputs):
            return {}
        lengths = plan_draft_lengths(inputs, model_cost or self.cost(), 1, n_other_rows)
        lengths = [k if k >= self.slots[c.slot].n_min else 0 for k, c in zip(lengths, decoding)]
        first = self.slots[decoding[0].slot]
        if alone and first.mode == MODEL and not probe and lengths == [0]:
            # above the break-even bound, yet no length pays: as idle as below it (without this, a slot whose rate
            # sat between the two never drafted, so never learned: 13 tokens drafted in 160, all of them accepted)
            if not _probe_due(first):
                return {}
            probe = True
        if probe:
            lengths = [max(lengths[0], first.n_min)]
        if len(decoding) > 1:  # one ubatch: every slot verifies the same number of rows (module docstring)
            lengths = [min(lengths)] * len(decoding)
        out: dict[int, list[int]] = {}
        want_model: dict[int, tuple[Sequence[int], int]] = {}
        for c, k, prop in zip(decoding, lengths, proposals):
            st = self.slots[c.slot]
            if st.mode == NGRAM:
                if k:
                    out[c.slot] = prop[:k]
                elif prop and not st.shadow.pending:
                    st.start_shadow(prop[:SHADOW_TOKENS])  # not verified: learn what it would have earned
            elif st.mode == MODEL and k:
                want_model[c.slot] = (c.tokens, k)
                st.probe_wait = min(2 * st.probe_wait, PROBE_MAX_STEPS) if probe else st.probe_wait
                st.idle = 0
        if want_model:
            t0 = time.perf_counter()
            drafts = self.draft_model.propose(want_model)
            n_drafted = sum(len(d) for d in drafts.values())
            if n_drafted and not probe:  # a probe's catch-up holds the idle steps' tokens: not the steady price
                self._draft_token.append((time.perf_counter() - t0) / n_drafted)
            out.update({s: d for s, d in drafts.items() if d})
        return out

    def record(self, slot: int, n_drafted: int, n_accepted: int) -> None:
        """One verification's verdict: ``n_accepted`` of ``n_drafted`` drafted tokens kept."""
        assert 0 <= n_accepted <= n_drafted, (n_accepted, n_drafted)
        st = self.slots[slot]
        st.history.record(n_drafted, n_accepted)
        if st.mode == MODEL and n_accepted:
            st.probe_wait = PROBE_STEPS  # the draft model pays again: probe soon after it stops
        if st.kinds:
            st.rates.record(st.kinds[:n_drafted], n_accepted)
        self.drafted += n_drafted
        self.accepted += n_accepted

    def observe_step(self, rows: int, seconds: float) -> None:
        """A decode step of ``rows`` rows took ``seconds`` (the target's ``llama_decode`` and sampling; a draft
        model's drafting is timed apart, see :meth:`plan`). A row count whose last sample is stale
        (:data:`STALE_STEPS`) starts its samples afresh."""
        self._step_no += 1
        q = self._steps.get(rows)
        if q is None:
            q = self._steps[rows] = deque(maxlen=STEP_SAMPLES)
        elif q and self._step_no - q[-1][0] > STALE_STEPS:
            q.clear()
        q.append((self._step_no, seconds))
        self._measured_here.add(rows)
        self._cost_stale = True
        if len(q) <= MIN_SAMPLES:  # a new or re-measured row count: its price changes now
            self._refit_now = True

    def pin_cost(self, cost: StepCost | None) -> None:
        """Use ``cost`` instead of the line fitted to measured steps (None: measure again). For tests and
        benchmarks that must not depend on how busy the machine is."""
        self._cost_pinned = cost is not None
        self._set_cost(cost or StepCost.fit(self._step_samples()))

    def seed_steps(self, steps: Sequence[tuple[int, float]]) -> None:
        """Start from ``(rows, seconds)`` steps measured earlier (another process: step_costs.StepCostStore);
        this engine's own steps push them out."""
        for rows, seconds in steps:
            q = self._steps.get(rows)
            if q is None:
                q = self._steps[rows] = deque(maxlen=STEP_SAMPLES)
            q.append((self._step_no, seconds))
        self._cost_stale = True
        self._refit_now = True

    def measured_steps(self) -> list[tuple[int, float]]:
        """The ``(rows, seconds)`` steps to remember for the next process: those the policy currently prices by
        (row counts measured within the last :data:`STALE_STEPS` steps) of the row counts this engine measured
        itself. A remembered price that made the policy avoid a batch size is not passed on unchecked: an
        ``ollapy run`` is shorter than STALE_STEPS, so otherwise a price timed under load would live forever."""
        return [(r, s) for r, s in self._step_samples() if r in self._measured_here]

    def _step_samples(self) -> list[tuple[int, float]]:
        fresh = self._step_no - STALE_STEPS
        return [(rows, s) for rows, q in self._steps.items() if q and q[-1][0] >= fresh for _, s in q]

    def cost(self) -> StepCost:
        """The step-time line fitted to the recent steps (or the pinned one): refitted when a row count has few
        samples, one may have gone stale, or :data:`REFIT_STEPS` steps passed since the last fit."""
        if self._cost_stale and not self._cost_pinned and (
                self._refit_now or self._step_no - self._fit_step >= REFIT_STEPS
                or self._step_no >= self._fit_expires):
            self._set_cost(StepCost.fit(self._step_samples()))
        return self._cost

    def _set_cost(self, cost: StepCost) -> None:
        self._cost = cost
        self._cost_stale = self._refit_now = False
        self._fit_step = self._step_no
        fresh = self._step_no - STALE_STEPS
        lasts = [q[-1][0] for q in self._steps.values() if q and q[-1][0] >= fresh]
        self._fit_expires = min(lasts, default=self._step_no) + STALE_STEPS + 1
        self._break_even.clear()

    def _model_cost(self, base_rows: int) -> StepTimer:
        """The step price when the draft model drafts: :meth:`cost` plus the median draft-model time per
        drafted token (:data:`~.draft_policy.PRIOR_DRAFT_COST` one-row steps until one was timed)."""
        cost = self.cost()
        per_token = (statistics.median(self._draft_token) if self._draft_token
                     else PRIOR_DRAFT_COST * cost.time(1))
        return ModelDraftCost(cost, per_token, base_rows)

    def _break_even_gain(self, n_min: int, available: int) -> float:
        """draft_policy.break_even_gain for the current cost, memoised until the next fit."""
        cost = self.cost()
        key = (n_min, available)
        got = self._break_even.get(key)
        if got is None:
            got = self._break_even[key] = break_even_gain(cost, n_min, available)
        return got

    # ---- draft model's sequences ----------------------------------------------------------------
    def shift(self, slot: int, n_keep: int, n_discard: int) -> None:
        """Mirror a context shift of ``slot`` in the draft model's sequence (the next step compares the tokens
        from ``n_keep`` on again)."""
        if self.draft_model is not None:
            self.draft_model.shift(slot, n_keep, n_discard)
