"""Speculative decoding's per-request costs on the engine thread are bounded and released: the n-gram index covers
a window of the context (not a 100k-token prompt), is emptied when the request ends, and a draft model's step
compares only the tokens added since its last step (not the whole context). Counted in tokens, not timed."""
from __future__ import annotations

import tracemalloc
from array import array

import pytest

from ollapy.engine.spec.ngram import NGRAM_WINDOW, NgramDrafter
from ollapy.engine.spec.speculator import Candidate, Speculator

LONG = 100_000


def _long_prompt(n: int = LONG) -> list[int]:
    return [(i * 7919) % 5003 for i in range(n)]  # repeats every 5003 tokens: lookups find matches


def _indexed(d: NgramDrafter) -> int:
    return sum(len(ix) for ix in d._index) + sum(len(a) for a in d._agree)


def test_a_long_prompt_indexes_only_the_window():
    spec = Speculator(1)
    assert spec.begin(0, _long_prompt(), "ngram", 8, 1) == "ngram"
    d = spec.slots[0].drafter
    assert len(d) == NGRAM_WINDOW < LONG
    assert _indexed(d) <= 2 * (d.max_ngram - d.min_ngram + 1) * NGRAM_WINDOW
    assert spec.plan([Candidate(0, (), 8)]) is not None  # drafting still works from the window
    assert d.propose(8)  # a periodic history: the window holds earlier periods


def test_the_index_stays_bounded_while_a_request_generates():
    d = NgramDrafter(max_ngram=4)
    d.reset(_long_prompt(NGRAM_WINDOW))
    for t in _long_prompt(3 * NGRAM_WINDOW):
        d.extend((t,))
        assert len(d) <= 2 * NGRAM_WINDOW
    assert d.propose(4)


def test_the_index_is_released_when_the_request_ends():
    spec = Speculator(1)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        spec.begin(0, _long_prompt(), "ngram", 8, 1)
        held = tracemalloc.get_traced_memory()[0] - base
        spec.end(0)
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    d = spec.slots[0].drafter
    assert len(d) == 0 and _indexed(d) == 0
    assert held > 1_000_000 and after < held / 20, (held, after)


@pytest.fixture(scope="module")
def draft_model(smollm2_path, smollm2_draft_path):
    from ollapy.engine.backend.context import Backend, ContextConfig
    from ollapy.engine.spec.draft_model import DraftModel

    cfg = ContextConfig(num_ctx=1024, num_batch=256, n_parallel=1)
    with Backend(smollm2_path, cfg) as target, Backend(smollm2_draft_path, cfg) as draft:
        yield DraftModel(draft, target, "smollm2", "smollm2-draft")


def test_a_draft_model_step_compares_only_the_new_tokens(draft_model):
    """Within a request the slot's tokens only grow (a context shift is mirrored apart): after the first step,
    each step compares the tokens added since the last one, not the whole context."""
    from ollapy.engine.spec.draft_model import PendingTokens

    dm = draft_model
    spec = Speculator(1, draft_model=dm)
    tokens = _long_prompt(900)
    tokens = [t % dm.n_vocab for t in tokens]
    assert spec.begin(0, tokens, "draft", 4, 1) == "model"
    dm.propose({0: (PendingTokens(tokens[:-1], tokens[-1]), 2)})  # the first step of a request: the whole prompt
    for step in range(5):
        accepted = dm.held(0)[len(tokens):len(tokens) + 1] or [1]
        tokens = tokens + accepted  # the target kept one drafted token
        before = dm.stats.compared
        got = dm.propose({0: (PendingTokens(tokens[:-1], tokens[-1]), 2)})[0]
        assert len(got) == 2
        assert dm.stats.compared - before <= 4, (step, dm.stats.compared - before)  # not ~900
    spec.end(0)


def test_pending_tokens_is_a_view_not_a_copy():
    from ollapy.engine.spec.draft_model import PendingTokens

    base = list(range(10))
    v = PendingTokens(base, 99)
    assert len(v) == 11 and v[0] == 0 and v[10] == 99 and v[-1] == 99 and v[-2] == 9
    assert list(v[8:]) == [8, 9, 99] and list(v[:2]) == [0, 1] and list(v) == base + [99]
    base.append(10)  # a view: it sees the list as it is
    assert len(v) == 12 and v[10] == 10 and v[11] == 99
    assert array("i", v[9:]) == array("i", [9, 10, 99])
