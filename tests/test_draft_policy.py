"""The batch-aware drafting policy (ollapy.engine.spec.policy): exact plans for measured step costs."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollapy.engine.spec.policy import (
    AcceptanceHistory,
    ShadowVerdict,
    SlotDraft,
    StepCost,
    break_even_gain,
    plan_draft_lengths,
    shadow_accepted,
)
from ollapy.engine.spec.speculator import SHADOW_TOKENS, STALE_STEPS, Candidate, Speculator

# SmolLM2-135M Q4_1 on 2 CPU cores (shared/ENVIRONMENT.md): 1/2/4/8 sequences decode at 96/129/162/179 tok/s,
# i.e. steps of 10.4/15.5/24.7/44.7 ms
SMOL = StepCost.fit([(1, 1 / 96), (2, 2 / 129), (4, 4 / 162), (8, 8 / 179)])
# a step bound by reading the weights (a GPU, a large model): extra rows nearly free
FLAT = StepCost(base=1.0, per_row=0.01)
# a line at 0.3 one-row steps per extra row (between a GPU's and a CPU's)
LINE = StepCost(base=0.7, per_row=0.3)


def test_fit_recovers_a_line_and_falls_back_to_the_prior():
    line = StepCost.fit([(1, 3.0), (2, 5.0), (4, 9.0), (4, 9.0)])
    assert line.base == pytest.approx(1.0) and line.per_row == pytest.approx(2.0)
    assert StepCost.fit([]) == StepCost.prior()
    one = StepCost.fit([(1, 0.02), (1, 0.02)])  # one batch size only: the prior's shape at the measured scale
    assert one.time(1) == pytest.approx(0.02) and one.time(2) == pytest.approx(0.03)
    assert StepCost.fit([(1, 2.0), (2, 1.0)]).per_row == 0.0  # noise never makes rows free of charge... or negative
    assert SMOL.base == pytest.approx(0.00565, abs=2e-4) and SMOL.per_row == pytest.approx(0.00488, abs=2e-4)


def test_one_slot_drafts_as_long_as_extra_rows_pay():
    assert plan_draft_lengths([SlotDraft(8, 0.9)], FLAT) == [8]
    assert plan_draft_lengths([SlotDraft(4, 0.8)], LINE) == [3]
    # SmolLM2 on the CPU: a row costs almost as much as a step, so only a near-certain draft pays
    assert plan_draft_lengths([SlotDraft(4, 0.8)], SMOL) == [2]
    assert plan_draft_lengths([SlotDraft(4, 0.5)], SMOL) == [0]


def test_busy_batches_draft_less_or_not_at_all():
    """llama.cpp PR #6828's trap: what pays for one slot costs with four or eight busy ones."""
    assert plan_draft_lengths([SlotDraft(4, 0.8)], SMOL) == [2]
    assert plan_draft_lengths([SlotDraft(4, 0.8)] * 4, SMOL) == [0, 0, 0, 0]
    assert plan_draft_lengths([SlotDraft(4, 0.95)] * 4, SMOL) == [2, 2, 2, 2]
    assert plan_draft_lengths([SlotDraft(4, 0.8)], LINE) == [3]
    assert plan_draft_lengths([SlotDraft(4, 0.8)] * 4, LINE) == [1, 1, 1, 1]
    assert plan_draft_lengths([SlotDraft(4, 0.8)] * 8, LINE) == [0] * 8
    assert plan_draft_lengths([SlotDraft(4, 0.95)] * 4, FLAT) == [4, 4, 4, 4]


def test_the_slot_that_repeats_drafts_and_the_others_do_not():
    plan = plan_draft_lengths([SlotDraft(4, 0.95), SlotDraft(4, 0.3), SlotDraft(0, 0.9)], LINE)
    assert plan == [4, 0, 0]


def test_prefill_rows_in_the_same_step_make_drafting_cheaper_relative_to_the_step():
    """A step that prefills 64 rows anyway is long: a few more rows add little to it."""
    assert plan_draft_lengths([SlotDraft(4, 0.5)], SMOL) == [0]
    assert plan_draft_lengths([SlotDraft(4, 0.5)], SMOL, n_other_rows=64) == [4]


def test_draft_min_is_a_block():
    assert plan_draft_lengths([SlotDraft(4, 0.8)], LINE, n_min=2) == [3]
    assert plan_draft_lengths([SlotDraft(1, 0.99)], FLAT, n_min=2) == [0]
    assert plan_draft_lengths([SlotDraft(4, 0.3)], LINE, n_min=3) == [0]


def test_measured_row_counts_use_their_median_and_unmeasured_ones_a_capped_line():
    """Gemma-3-270M on 2 cores: one row in vec_dot, 2-4 rows in one tinyBLAS pass, 5 rows a second pass."""
    ms = {1: 18.0, 2: 34.0, 3: 36.0, 5: 62.0}
    cost = StepCost.fit([(r, v) for r, v in ms.items() for _ in range(3)] + [(4, 99.0), (4, 99.0)])
    assert {r: cost.time(r) for r in ms} == ms  # medians where 3 steps were measured
    line = cost.base + cost.per_row * 4
    assert line > 40  # the line through 1, 2, 3, 5 (and two slow 4-row steps) makes 4 rows dear...
    assert cost.time(4) == pytest.approx(36.0 * (1 + 0.5 / 3))  # ...the cap: 3 rows' median plus the prior's price
    assert cost.time(9) == pytest.approx(min(cost.base + cost.per_row * 9, 62.0 * (1 + 0.5 * 4 / 5)))
    # with those costs a proposal the history backs drafts 3 tokens (4 rows), not 1 (as a line would say)
    backed = SlotDraft(6, 0.5, (0.95, 0.9, 0.85, 0.3, 0.1, 0.05))
    assert plan_draft_lengths([backed], cost) == [3]


def test_a_price_learned_while_the_machine_was_busy_goes_stale_and_is_measured_again():
    """Remembered step times (step_costs.StepCostStore) that make extra rows dear stop drafting; once they were not
    measured for STALE_STEPS steps they are priced as unmeasured, the slot drafts again, and the new 4-row steps
    replace the old ones. Only the batch sizes this engine measured itself are remembered for the next process."""
    sp = Speculator(1)
    sp.seed_steps([(1, 0.020)] * 16 + [(r, 0.1 * r) for r in (2, 3, 4) for _ in range(16)])  # 5-20 one-row steps
    sp.begin(0, [1, 2, 3, 4, 5, 6, 7] * 20, "ngram", 4, 1)  # a text that repeats: the proposal is backed
    cand = [Candidate(0, (), 50)]
    assert sp.plan(cand) == {}
    for _ in range(STALE_STEPS):
        assert sp.plan(cand) == {}
        sp.observe_step(1, 0.020)
    assert set(sp.cost().measured) == {1, 2, 3, 4}  # priced: within STALE_STEPS of their samples
    assert {r for r, _ in sp.measured_steps()} == {1}  # remembered: only what this engine measured itself
    sp.observe_step(1, 0.020)
    assert set(sp.cost().measured) == {1}  # stale: no longer priced
    assert sp.plan(cand) == {0: [1, 2, 3, 4]}  # drafting again, at the prior's price of extra rows
    sp.observe_step(5, 0.060)
    sp.observe_step(4, 0.041)
    assert sorted(sp.measured_steps()) == [(1, 0.020)] * 16 + [(4, 0.041), (5, 0.060)]


def test_a_slot_that_starts_copying_drafts_within_a_few_tokens_whatever_its_cap():
    """A passage seen once (ONCE contexts, doubtful at first) is learned from shadow verdicts on proposals the slot
    did not verify. A shadow's verdict is known only once its tokens were generated, so shadows are cut to
    SHADOW_TOKENS: with n-gram drafting's cap of 16 as the shadow's length, this slot waited 17 tokens (and on
    bench_spec's paragraph copy ~30 steps) before it drafted; now 9. Costs: Gemma 3's measured AVX2 table."""
    costs = {1: 20, 2: 32, 3: 52, 4: 47, 5: 65, 6: 61, 7: 79, 8: 71, 9: 93, 10: 86, 11: 100, 12: 105, 13: 120,
             14: 118, 15: 130, 16: 128, 17: 145}
    sp = Speculator(1)
    sp.seed_steps([(rows, ms / 1000) for rows, ms in costs.items() for _ in range(16)])
    passage = list(range(100, 160))
    sp.begin(0, [1, 2, 3, *passage, 4, 5], "ngram", -1, 1)  # draft_num_predict unset: 16 for n-gram drafting
    for i, tok in enumerate(passage):  # noqa: B007 - i is the answer, read after the loop
        got = sp.plan([Candidate(0, (), 50)])
        if got:
            break
        sp.accept(0, tok)
    assert SHADOW_TOKENS == 4 and i == 9 and got == {0: passage[9:12]}


def test_per_token_survival_cuts_a_draft_where_the_history_stops_backing_it():
    assert plan_draft_lengths([SlotDraft(5, 0.9, (0.95, 0.9, 0.2, 0.1, 0.05))], LINE) == [2]
    assert plan_draft_lengths([SlotDraft(5, 0.1, (0.95, 0.9, 0.85, 0.8, 0.75))], FLAT) == [5]  # survival wins
    assert plan_draft_lengths([SlotDraft(3, 0.9, (0.3, 0.2, 0.1))], LINE) == [0]
    with pytest.raises(ValueError, match="survival"):
        plan_draft_lengths([SlotDraft(3, 0.9, (0.9,))], FLAT)


def test_context_rates_learn_per_kind_and_first_token_and_follow_the_text():
    from ollapy.engine.spec.ngram import NOVEL, ONCE, SEEN
    from ollapy.engine.spec.policy import ContextRates
    r = ContextRates()
    assert r.rate(NOVEL, True) == pytest.approx(1 / 3) and r.rate(ONCE, False) == 0.5
    for _ in range(10):  # copies: every ONCE token kept
        r.record([ONCE, ONCE, ONCE], 3)
    assert r.rate(ONCE, True) > 0.9 and r.rate(ONCE, False) > 0.9 and r.rate(NOVEL, True) == pytest.approx(1 / 3)
    for _ in range(10):  # then the first token after a number is wrong each time; later tokens never judged
        r.record([NOVEL, ONCE], 0)
    assert r.rate(NOVEL, True) < 0.2 and r.rate(ONCE, False) > 0.9
    assert r.survival([(SEEN, 0.5), (ONCE, 0.0)]) == pytest.approx([0.5, 0.5 * r.rate(ONCE, False)])
    with pytest.raises(ValueError, match="n_accepted"):
        r.record([ONCE], 2)
    r.clear()
    assert r.rate(NOVEL, True) == pytest.approx(1 / 3)


def test_nothing_to_plan_and_bad_input():
    assert plan_draft_lengths([], FLAT) == []
    with pytest.raises(ValueError, match="n_min"):
        plan_draft_lengths([SlotDraft(1, 0.5)], FLAT, n_min=0)
    with pytest.raises(ValueError, match="acceptance"):
        plan_draft_lengths([SlotDraft(1, 1.5)], FLAT)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.floats(0, 1)), max_size=8), st.integers(1, 3),
       st.floats(0.01, 2.0), st.integers(0, 64))
def test_a_plan_respects_the_limits_and_never_predicts_a_loss(slots, n_min, per_row, other):
    cost = StepCost(1.0, per_row)
    drafts = [SlotDraft(n, a) for n, a in slots]
    plan = plan_draft_lengths(drafts, cost, n_min=n_min, n_other_rows=other)
    assert len(plan) == len(drafts)
    assert all(k == 0 or n_min <= k <= d.available for k, d in zip(plan, drafts))
    rows = len(drafts) + other
    if any(plan) and rows:
        gained = sum(sum(d.acceptance ** j for j in range(1, k + 1)) for k, d in zip(plan, drafts))
        before = len(drafts) / cost.time(rows)
        after = (len(drafts) + gained) / cost.time(rows + sum(plan))
        assert after >= before * 1.03


def test_acceptance_history_follows_recent_verifications():
    h = AcceptanceHistory(window=4)
    assert h.rate() == pytest.approx(2 / 3)  # the prior: a new slot tries
    h.record(4, 4)
    h.record(4, 4)
    assert h.rate() == pytest.approx(10 / 11) and h.totals() == (8, 8)
    for _ in range(4):
        h.record(4, 0)
    assert h.rate() == pytest.approx(2 / 7) and h.totals() == (16, 0)  # the window forgot the good ones
    h.record(0, 0)
    assert h.totals() == (16, 0)
    h.clear()
    assert h.rate() == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        h.record(2, 3)
    with pytest.raises(ValueError):
        AcceptanceHistory(window=0)


def test_shadow_verdicts_count_what_verification_would_have_kept():
    assert shadow_accepted([5, 6, 7], [5, 6, 9, 7]) == 2
    assert shadow_accepted([5, 6], [5, 6, 7]) == 2
    assert shadow_accepted([5, 6, 7], [5]) == 1
    assert shadow_accepted([], [1]) == 0


def test_a_shadow_verdict_is_recorded_when_it_is_decided():
    h = AcceptanceHistory()
    shadow = ShadowVerdict(h)
    shadow.observe(1)  # nothing pending: nothing recorded
    shadow.start([5, 6, 7])
    shadow.observe(5)
    shadow.observe(6)
    assert shadow.pending and h.totals() == (0, 0)
    shadow.observe(9)  # the slot generated 9 where the proposal said 7
    assert not shadow.pending and h.totals() == (3, 2)
    shadow.start([4, 4])
    shadow.observe(4)
    shadow.observe(4)
    assert h.totals() == (5, 4) and h.rate() == pytest.approx((4 + 2) / (4 + 1 + 3))
    shadow.start([1])
    shadow.start([2])  # replaced: the first is never recorded
    shadow.observe(3)
    assert h.totals() == (6, 4)



@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.005, 0.2), min_size=17, max_size=17),
       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16), st.integers(1, 3), st.floats(0.0, 1.0))
def test_below_the_break_even_gain_one_slot_never_drafts(times, probs, n_min, acceptance):
    """break_even_gain is a bound plan_draft_lengths never crosses: a first token less likely than it means no
    drafts (so the engine skips pricing the rest of a proposal), for any step-time table and survival curve."""
    cost = StepCost(base=0.01, per_row=0.005, measured={r: t for r, t in enumerate(times, 1)})
    survival, p = [], 1.0
    for q in probs:  # a survival curve: cumulative products, non-increasing
        p *= q
        survival.append(p)
    n = len(survival)
    bound = break_even_gain(cost, n_min, n)
    if survival[0] < bound - 1e-9:
        assert plan_draft_lengths([SlotDraft(n, acceptance, survival)], cost, n_min) == [0]
    if acceptance < bound - 1e-9:
        assert plan_draft_lengths([SlotDraft(n, acceptance)], cost, n_min) == [0]


def test_the_break_even_gain_is_what_a_first_token_needs_on_smollm2():
    """On SmolLM2's 2-core table a row costs half a one-row step: a sure proposal of 4 pays from a first-token
    probability of about 0.5 (the 4-row step's price), and a proposal of 1 needs more."""
    four, one = break_even_gain(SMOL, 1, 4), break_even_gain(SMOL, 1, 1)
    assert 0.4 < four < one < 1.0
    assert plan_draft_lengths([SlotDraft(4, 0.0, [four + 0.01] * 4)], SMOL) != [0]
    assert plan_draft_lengths([SlotDraft(4, 0.0, [four - 0.01] * 4)], SMOL) == [0]
    assert break_even_gain(SMOL, 2, 1) == float("inf")  # draft_min above what is available: never


def test_skipping_proposals_below_the_break_even_gain_plans_exactly_as_pricing_them(monkeypatch):
    """The engine's shortcut (Speculator.plan prices only a proposal's first token when it cannot pay) changes no
    plan and no verdict: two speculators over the same 3,000-token stream of free text and copied spans, one with
    the shortcut off, plan the same drafts at every step. Costs: SmolLM2's measured 2-core table."""
    import random

    rng = random.Random(7)
    phrase = [rng.randrange(50, 90) for _ in range(30)]
    stream: list[int] = []
    while len(stream) < 3000:
        stream += phrase[rng.randrange(10):] if rng.random() < 0.3 else [rng.randrange(10, 200) for _ in range(20)]
    fast, full = Speculator(1), Speculator(1)
    monkeypatch.setattr(full, "_break_even_gain", lambda n_min, available: float("-inf"))
    for sp in (fast, full):
        sp.seed_steps([(rows, ms / 1000) for rows, ms in {1: 9.9, 2: 17.9, 3: 24.0, 4: 24.7, 8: 44.7}.items()
                       for _ in range(16)])
        sp.begin(0, phrase[:12], "ngram", -1, 1)
    i = drafted = skipped = 0
    while i < len(stream) - 20:
        got = fast.plan([Candidate(0, (), 50)])
        assert got == full.plan([Candidate(0, (), 50)])
        draft = got.get(0, [])
        drafted += bool(draft)
        skipped += not draft and bool(fast.slots[0].drafter.propose(16))
        kept = shadow_accepted(draft, stream[i:i + len(draft)])
        for sp in (fast, full):
            if draft:
                sp.record(0, len(draft), kept)
            for tok in stream[i:i + kept + 1]:
                sp.accept(0, tok)
            sp.observe_step(1 + len(draft), 0.0099 + 0.004 * len(draft))
        i += kept + 1
    assert fast.slots[0].history.totals() == full.slots[0].history.totals()
    assert drafted > 20 and skipped > 200  # both paths taken, many times


# ---- a draft model's price and probes ------------------------------------------------------------------------
# Gemma 3 270M on the 2-core AVX-512 Xeon: target steps of 1-5 rows (ms; scripts/measure_row_cost.py)
GEMMA_XEON = StepCost.fit([(r, ms / 1000) for r, ms in {1: 22.7, 2: 24.0, 3: 27.0, 4: 31.2, 5: 45.0}.items()
                           for _ in range(16)])


def test_a_draft_models_tokens_are_priced_apart_from_the_targets_rows():
    """ModelDraftCost adds the draft model's time per drafted row to the target's step: with its 16-block,
    32k-token Gemma draft (~10 ms a token) and a 98% acceptance the plan drafts 3 (4 rows, one pass of the
    AVX-512 tiles), with a draft as dear as 25 ms a token nothing."""
    from ollapy.engine.spec.policy import ModelDraftCost

    cheap = ModelDraftCost(GEMMA_XEON, 0.010, base_rows=1)
    assert cheap.time(1) == GEMMA_XEON.time(1) and cheap.time(4) == pytest.approx(GEMMA_XEON.time(4) + 0.030)
    assert plan_draft_lengths([SlotDraft(4, 0.98)], cheap) == [3]
    assert plan_draft_lengths([SlotDraft(4, 0.98)], ModelDraftCost(GEMMA_XEON, 0.025, base_rows=1)) == [0]
    assert ModelDraftCost(GEMMA_XEON, 0.010, base_rows=3).time(4) == pytest.approx(GEMMA_XEON.time(4) + 0.010)


class _ScriptedDraft:
    """Stands in for DraftModel (the llama.cpp boundary): proposes token 7 ``n`` times and records the requests."""

    def __init__(self) -> None:
        from ollapy.engine.spec.draft_model import DraftStats

        self.stats = DraftStats()
        self.asked: list[int] = []

    def propose(self, requests):
        self.asked.extend(n for _, n in requests.values())
        return {s: [7] * n for s, (_, n) in requests.items()}

    def reset(self, seq: int) -> None:
        pass


def test_a_draft_model_probes_at_once_and_again_after_a_rejection_with_a_growing_wait():
    """A draft model has no free shadow: without probes, a slot whose prior (2/3) is under the break-even gain
    never drafted, and one rejected proposal stopped it for good (bench_spec's draft-model row drafted 1 token in
    160). Now the first step probes draft_min tokens, a rejected probe doubles the wait before the next, an
    accepted one brings it back to PROBE_STEPS."""
    from ollapy.engine.spec.speculator import PROBE_STEPS

    draft = _ScriptedDraft()
    sp = Speculator(1, draft_model=draft, draft_name="d.gguf")
    # rows dear enough that the prior (2/3) does not pay, cheap enough that a proposal accepted in full would
    sp.seed_steps([(r, ms / 1000) for r, ms in {1: 20, 2: 26, 3: 32}.items() for _ in range(16)])
    sp.begin(0, [1, 2, 3], "d.gguf", -1, 1)
    cand = [Candidate(0, [1, 2, 3], 50)]

    def steps_until_draft(limit: int = 600) -> int:
        for i in range(limit):
            got = sp.plan(cand)
            if got:
                assert got == {0: [7]}  # a probe: draft_min tokens
                return i
        raise AssertionError("never drafted")

    assert steps_until_draft() == 0  # at once: nothing learned yet
    waits = []
    for _ in range(3):
        sp.record(0, 1, 0)
        waits.append(steps_until_draft())
    assert waits == [2 * PROBE_STEPS - 1, 4 * PROBE_STEPS - 1, 8 * PROBE_STEPS - 1]
    sp.record(0, 1, 1)  # the draft pays again
    assert steps_until_draft() == PROBE_STEPS - 1 and draft.asked == [1] * 5


def test_a_draft_model_never_probes_where_not_even_a_full_acceptance_pays():
    """Qwen2.5-Coder-1.5B's steps on 2 AVX-512 cores (ms by rows, scripts/measure_row_cost.py: each verified row
    costs nearly a step) with its 0.5B draft unpriced (the prior, half a step a token, under the 0.45 measured):
    no acceptance pays, so no step probes. Before, a probe every PROBE_STEPS steps (the probes were accepted, which
    reset the wait) drafted 32 of 285 tokens at 0.86x plain decoding (bench_spec --rows q)."""
    draft = _ScriptedDraft()
    sp = Speculator(1, draft_model=draft, draft_name="d.gguf")
    sp.seed_steps([(r, ms / 1000) for r, ms in {1: 48.4, 2: 95.0, 3: 122.3, 4: 143.7, 5: 171.2}.items()
                   for _ in range(16)])
    sp.begin(0, [1, 2, 3], "d.gguf", -1, 1)
    assert not any(sp.plan([Candidate(0, [1, 2, 3], 50)]) for _ in range(100)) and draft.asked == []


def test_a_draft_model_probes_when_its_rate_passes_the_break_even_bound_but_no_length_pays():
    """Between the two tests (the first-token bound passed, plan_draft_lengths says 0) a slot also counts as idle
    and probes; before, it sat there for good: on bench_spec's draft-model row, a process seeded with the last
    one's step times drafted 13 tokens in 160 (all accepted) at 0.95x plain."""
    from ollapy.engine.spec.policy import ModelDraftCost
    from ollapy.engine.spec.speculator import PROBE_STEPS

    draft = _ScriptedDraft()
    sp = Speculator(1, draft_model=draft, draft_name="d.gguf")
    sp.seed_steps([(r, ms / 1000) for r, ms in {1: 23.8, 2: 30.0}.items() for _ in range(16)])
    sp.begin(0, [1, 2, 3], "d.gguf", -1, 1)
    cand = [Candidate(0, [1, 2, 3], 50)]
    assert sp.plan(cand) == {0: [7]}  # the first step's probe
    sp.record(0, 1, 1)
    sp.record(0, 1, 1)
    rate = sp.slots[0].history.rate()
    price = ModelDraftCost(sp.cost(), 0.5 * sp.cost().time(1), 1)  # no proposal timed yet: the prior price
    assert rate >= break_even_gain(price, 1, 4) and plan_draft_lengths([SlotDraft(4, rate)], price) == [0]
    waits = [i for i in range(40) if sp.plan(cand)]
    assert waits[0] == PROBE_STEPS - 1 and draft.asked[:2] == [1, 1]
