"""Real-model tests of the engine's slots and continuous batching (SmolLM2, greedy)."""
from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pytest
from conftest import cancel_after_first_chunk
from hypothesis import given, settings
from hypothesis import strategies as st

from ollapy.errors import BusyError, Cancelled
from ollapy.options import Options

PROMPTS = [
    "What is the capital of France? Answer in one word.",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "List the days of the week.",
]
GREEDY = Options(temperature=0, num_predict=24, num_ctx=512)


def _load(path, n_parallel, **kw):
    from ollapy.engine.model import LoadedModel

    return LoadedModel(path, Options(num_ctx=512, num_parallel=n_parallel, **kw), max_queue=kw.pop("max_queue", 64))


def _chat(model, text, options=GREEDY):
    return model.chat([{"role": "user", "content": text}], options)


@pytest.fixture(scope="module")
def alone(smollm2_path):
    """Each prompt decoded alone in a single-slot engine: (text, tokens) per prompt."""
    m = _load(smollm2_path, 1)
    out = []
    for p in PROMPTS:
        req = _chat(m, p)
        text, final = req.result()
        out.append((text, list(req.output_tokens), final.done_reason))
    m.close()
    return out


@pytest.fixture(scope="module")
def model4(smollm2_path):
    m = _load(smollm2_path, 4)
    yield m
    m.close()


@pytest.mark.parametrize("n_parallel", [1, 2, 4])
def test_parallel_equals_alone(smollm2_path, alone, n_parallel):
    m = _load(smollm2_path, n_parallel)
    try:
        reqs = [_chat(m, p) for p in PROMPTS]
        for req, (text, toks, reason) in zip(reqs, alone):
            got, final = req.result()
            assert req.output_tokens == toks
            assert got == text
            assert final.done_reason == reason
            assert final.metrics.eval_count == len(toks) <= 24
    finally:
        m.close()


def test_joining_mid_generation_equals_alone(model4, alone):
    """Requests that arrive while others are decoding join the running batch and still match."""
    first = _chat(model4, PROMPTS[0], GREEDY.merged({"num_predict": 24}))
    it = iter(first)
    seen = [next(it) for _ in range(3)]  # first is now generating
    late = [_chat(model4, p) for p in PROMPTS[1:]]
    rest = "".join(c.text for c in seen) + "".join(c.text for c in it)
    assert first.output_tokens == alone[0][1]
    assert rest == alone[0][0]
    for req, (_text, toks, _reason) in zip(late, alone[1:]):
        req.result()
        assert req.output_tokens == toks
    assert model4.engine.stats()["slots_busy"] == 0


def test_ten_requests_over_two_slots(smollm2_path, alone):
    m = _load(smollm2_path, 2)
    try:
        reqs = [_chat(m, PROMPTS[i % 4]) for i in range(10)]
        for i, r in enumerate(reqs):
            text, final = r.result()
            assert r.output_tokens == alone[i % 4][1]
        assert m.engine.stats() == {**m.engine.stats(), "slots_busy": 0, "queue_depth": 0}
    finally:
        m.close()


def test_queue_bound_gives_busy_fast_and_engine_recovers(smollm2_path, alone):
    from ollapy.engine.model import LoadedModel

    m = LoadedModel(smollm2_path, Options(num_ctx=512, num_parallel=1), max_queue=1)
    try:
        accepted, busy = [], 0
        for _ in range(6):
            try:
                accepted.append(_chat(m, PROMPTS[0]))
            except BusyError as exc:
                busy += 1
                assert "busy" in str(exc)
        assert busy >= 3 and len(accepted) >= 1
        for r in accepted:
            r.result()
        r = _chat(m, PROMPTS[1])
        r.result()
        assert r.output_tokens == alone[1][1]
    finally:
        m.close()


def test_cancel_mid_decode_and_mid_prefill_frees_slot(smollm2_path, alone):
    m = _load(smollm2_path, 1, num_batch=32)
    try:
        cancel_after_first_chunk(_chat(m, PROMPTS[2], GREEDY.merged({"num_predict": 400})))
        # mid-prefill: a long prompt read in 32-token chunks, cancelled right away
        big = _chat(m, "word " * 400, GREEDY)
        deadline = time.monotonic() + 30
        while not big.metrics.prompt_eval_count and time.monotonic() < deadline:  # assigned a slot: prefilling
            time.sleep(0.005)
        big.cancel()
        with pytest.raises(Cancelled):
            big.result()
        assert big.cancelled_in == "prefill"
        deadline = time.monotonic() + 5
        while m.engine.stats()["slots_busy"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.engine.stats()["slots_busy"] == 0
        r = _chat(m, PROMPTS[3])
        r.result()
        assert r.output_tokens == alone[3][1]
    finally:
        m.close()


def test_a_cancel_stops_the_decode_in_flight_unless_another_request_needs_it(smollm2_path, alone):
    """The decode in flight stops at the cancel when no other request's rows are in it (llama.cpp's abort
    callback: engine/inflight.py): a 512-token prefill chunk cancelled early ends within a fraction of the chunk's
    time, not at its end. Beside a live request the step runs on, and both slots then answer as alone."""
    m = _load(smollm2_path, 2, num_batch=512)
    try:
        prompt = m.raw_prompt("word " * 1500)
        opts = GREEDY.merged({"num_predict": 1})
        whole = m.submit(prompt, opts, cache=False)
        whole.result()
        chunk_s = whole.metrics.prompt_eval_duration / 1e9 / -(-len(prompt.tokens) // 512)  # a 512-token chunk, timed
        big = m.submit(m.raw_prompt("other " * 1500), opts, cache=False)  # no prefix in common with the slots'
        deadline = time.monotonic() + 30
        while not big.planned.is_set() and time.monotonic() < deadline:  # placed in a slot: its prefill starts
            time.sleep(0.001)
        time.sleep(chunk_s / 4)  # inside the first chunk's llama_decode
        t0 = time.perf_counter()
        big.cancel()
        with pytest.raises(Cancelled):
            big.result()
        took = time.perf_counter() - t0
        assert big.cancelled_in == "prefill" and took < chunk_s / 3, (took, chunk_s)
        assert m.engine.stats()["slots_busy"] == 0
        # two requests decode in one batch: cancelling one leaves the other's step alone
        live, doomed = _chat(m, PROMPTS[0]), _chat(m, PROMPTS[2], GREEDY.merged({"num_predict": 400}))
        cancel_after_first_chunk(doomed)
        text, _ = live.result()
        assert live.output_tokens == alone[0][1]
        again = [_chat(m, p) for p in PROMPTS[1:3]]
        assert [r.result() and list(r.output_tokens) for r in again] == [alone[1][1], alone[2][1]]
    finally:
        m.close()


def test_num_predict_exact(model4):
    for n in (1, 7, 33):
        r = model4.submit(model4.raw_prompt("Count from 1 to 100: 1, 2, 3, 4,"), GREEDY.merged({"num_predict": n}))
        _, final = r.result()
        assert final.metrics.eval_count == n == len(r.output_tokens)
        assert final.done_reason == "length"


def test_stop_string_spanning_tokens_is_cut_exactly(model4, alone):
    text, toks, _ = alone[0]  # "The capital of France is Paris."
    assert "Paris" in text
    # a stop string that starts inside one token and ends in a later one
    idx = text.index("Paris")
    stop = text[idx - 3: idx + 3]
    pieces = [model4.backend.token_piece(t).decode("utf-8", "replace") for t in toks]
    spans, pos = [], 0
    for p in pieces:
        spans.append((pos, pos + len(p)))
        pos += len(p)
    touched = [i for i, (a, b) in enumerate(spans) if a < idx + 3 and b > idx - 3]
    assert len(touched) >= 2, "test stop string must span two tokens"
    r = _chat(model4, PROMPTS[0], GREEDY.merged({"stop": [stop]}))
    got, final = r.result()
    assert got == text[: idx - 3]
    assert final.done_reason == "stop"


def test_utf8_streaming_never_splits_characters(model4):
    opts = GREEDY.merged({"num_predict": 40})
    r = _chat(model4, "Reply with five emoji and the Japanese word for cat (猫): 🐱🎉", opts)
    chunks = [c.text for c in r]
    for c in chunks:
        c.encode("utf-8")  # a split surrogate/partial char would not round-trip
        assert "\ufffd" not in c
    streamed = "".join(chunks)
    again = _chat(model4, "Reply with five emoji and the Japanese word for cat (猫): 🐱🎉", opts)
    whole, _ = again.result()
    assert streamed == whole
    raw = b"".join(model4.backend.token_piece(t) for t in r.output_tokens)
    assert raw.decode("utf-8", errors="replace").startswith(streamed.rstrip("\ufffd")[:10])
    assert any(ord(ch) > 0x2000 for ch in streamed), streamed


def test_decode_error_fails_only_that_batch(smollm2_path, alone, monkeypatch):
    from ollapy.errors import DecodeError

    m = _load(smollm2_path, 2)
    try:
        real = m.backend.decode
        calls = {"n": 0}

        def flaky(*a):
            calls["n"] += 1
            if calls["n"] == 1:
                raise DecodeError("decode failed: no free KV cache space")
            return real(*a)

        monkeypatch.setattr(m.backend, "decode", flaky)
        bad = _chat(m, PROMPTS[0])
        with pytest.raises(DecodeError):
            bad.result()
        ok = _chat(m, PROMPTS[1])
        ok.result()
        assert ok.output_tokens == alone[1][1]
    finally:
        m.close()


def test_concurrent_submitters_from_threads(model4, alone):
    results = {}

    def worker(i):
        r = _chat(model4, PROMPTS[i])
        r.result()
        results[i] = r.output_tokens

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    assert [results[i] for i in range(4)] == [a[1] for a in alone]


def test_seed_reproducible(model4):
    opts = Options(temperature=0.9, seed=42, num_predict=20, num_ctx=512)
    a = _chat(model4, "Tell me a story.", opts)
    a.result()
    b = _chat(model4, "Tell me a story.", opts)
    b.result()
    assert a.output_tokens == b.output_tokens


@pytest.mark.parametrize("extra", [{}, {"repeat_penalty": 1.5, "repeat_last_n": 16}, {"repeat_penalty": 1.3},
                                   {"presence_penalty": 0.8}, {"repeat_penalty": 1.0}])
def test_greedy_fast_path_matches_the_llama_sampler_chain(model4, monkeypatch, extra):
    from ollapy.engine import sampler

    opts = GREEDY.merged({"num_predict": 48, **extra})
    fast = model4.submit(model4.raw_prompt("1, 2, 3, 1, 2, 3, 1, 2,"), opts)
    fast.result()
    real_init = sampler.Sampler.__init__

    def chain_only(self, *a, **kw):
        real_init(self, *a, **kw)
        self._fast = False

    monkeypatch.setattr(sampler.Sampler, "__init__", chain_only)
    slow = model4.submit(model4.raw_prompt("1, 2, 3, 1, 2, 3, 1, 2,"), opts)
    slow.result()
    assert fast.output_tokens == slow.output_tokens


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-4, 4), min_size=2, max_size=40), st.data(), st.sampled_from([1.0, 1.1, 1.3, 2.0]))
def test_penalized_argmax_equals_penalizing_every_recent_token(values, data, penalty):
    # integer logits make ties common: the first index of the maximum must win, as with one full argmax
    from ollapy.engine.sampler import Sampler

    logits = np.array(values, dtype=np.float32) * np.float32(0.5)
    recent = data.draw(st.sets(st.integers(0, len(values) - 1), max_size=len(values)))
    s = Sampler.__new__(Sampler)  # only the penalty state is needed, not a llama.cpp chain
    s._counts = collections.Counter(recent)
    s._rp = np.float32(penalty)
    full = logits.copy()
    for t in recent:
        full[t] = full[t] * s._rp if full[t] <= 0 else full[t] / s._rp
    before = logits.copy()
    got = s._penalized_argmax(logits, int(logits.argmax())) if int(logits.argmax()) in recent else int(logits.argmax())
    assert got == int(full.argmax())
    assert np.array_equal(logits, before)  # the buffer is restored
