"""Context shift on overflow and prompt truncation, on both real test models."""
from __future__ import annotations

import re

import pytest

from ollapy.errors import ContextError
from ollapy.options import Options

COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def _load(path, n_parallel=1, num_ctx=64):
    from ollapy.engine.model import LoadedModel

    return LoadedModel(path, Options(num_ctx=num_ctx, num_parallel=n_parallel))


def _assert_counts_on(text: str) -> None:
    nums = [int(x) for x in re.findall(r"\d+", text)]
    assert len(nums) > 20, text
    assert nums == list(range(11, 11 + len(nums))), text


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_greedy_count_survives_several_shifts(request, model):
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "gemma_path")
    m = _load(path, num_ctx=64)
    try:
        opts = Options(temperature=0, num_predict=160, num_ctx=64)
        req = m.submit(m.raw_prompt(COUNT), opts)
        text, final = req.result()
        assert final.metrics.shifts >= 2
        assert final.metrics.eval_count == 160 == len(req.output_tokens)
        assert final.done_reason == "length"
        _assert_counts_on(text)
    finally:
        m.close()


def test_shift_keeps_system_prompt_tokens(smollm2_path):
    m = _load(smollm2_path, num_ctx=96)
    try:
        msgs = [{"role": "system", "content": "You are a counting machine."},
                {"role": "user", "content": "Count from 1 to 1000 with commas."}]
        prompt = m.chat_prompt(msgs)
        assert prompt.keep >= 8
        req = m.submit(prompt, Options(temperature=0, num_predict=150, num_ctx=96, repeat_penalty=1.0))
        _, final = req.result()
        if final.metrics.shifts:
            assert final.tokens[: prompt.keep] == prompt.tokens[: prompt.keep]
        else:  # the model stopped before filling the window: nothing to shift
            assert final.done_reason == "stop"
    finally:
        m.close()


def test_only_the_shifting_slot_is_affected(smollm2_path):
    short = ["What is the capital of France? Answer in one word.", "Name three primary colors."]
    opts = Options(temperature=0, num_predict=16, num_ctx=96)
    single = _load(smollm2_path, 1, num_ctx=96)
    try:
        alone = []
        for q in short:
            r = single.chat([{"role": "user", "content": q}], opts)
            r.result()
            alone.append(r.output_tokens)
    finally:
        single.close()
    m = _load(smollm2_path, 3, num_ctx=96)
    try:
        long = m.submit(m.raw_prompt(COUNT), Options(temperature=0, num_predict=200, num_ctx=96))
        others = [m.chat([{"role": "user", "content": q}], opts) for q in short]
        for r, want in zip(others, alone):
            r.result()
            assert r.output_tokens == want
        text, final = long.result()
        assert final.metrics.shifts >= 2
        _assert_counts_on(text)
    finally:
        m.close()


def test_shift_false_ends_with_length(smollm2_path):
    m = _load(smollm2_path, num_ctx=64)
    try:
        req = m.submit(m.raw_prompt(COUNT), Options(temperature=0, num_predict=500, num_ctx=64, shift=False))
        _, final = req.result()
        assert final.done_reason == "length" and final.metrics.shifts == 0
        assert len(final.tokens) <= 64
    finally:
        m.close()


@pytest.mark.parametrize("factor", ["n-1", "n", "n+1", "2n", "16n"])
@pytest.mark.parametrize("cache", [True, False])
def test_long_prompts_truncate_or_fail_clearly(smollm2_path, factor, cache):
    n_ctx = 128
    m = _load(smollm2_path, num_ctx=n_ctx)
    try:
        base = m.tokenize("hello")
        n = {"n-1": n_ctx - 1, "n": n_ctx, "n+1": n_ctx + 1, "2n": 2 * n_ctx, "16n": 16 * n_ctx}[factor]
        filler = m.tokenize(" ".join(["word"] * (n + 10)))
        toks = (base + filler)[:n]
        assert len(toks) == n
        opts = Options(temperature=0, num_predict=8, num_ctx=n_ctx)
        req = m.engine.submit(toks, opts, cache=cache)
        _, final = req.result()
        assert final.metrics.truncated == (n >= n_ctx)
        assert final.metrics.eval_count >= 1
        if n >= n_ctx:
            with pytest.raises(ContextError) as ei:
                m.engine.submit(toks, opts.merged({"truncate": False}), cache=cache)
            assert str(n) in str(ei.value) and str(n_ctx) in str(ei.value)
    finally:
        m.close()


def test_num_keep_nearly_filling_the_window_is_clamped(smollm2_path):
    m = _load(smollm2_path, num_ctx=64)
    try:
        req = m.submit(m.raw_prompt(COUNT), Options(temperature=0, num_predict=120, num_ctx=64, num_keep=63))
        text, final = req.result()
        assert final.metrics.eval_count == 120
        assert final.metrics.shifts >= 2
    finally:
        m.close()


def test_long_chat_is_truncated_by_message_keeping_the_template(smollm2_path):
    m = _load(smollm2_path, num_ctx=256)
    try:
        doc = " ".join(f"Paragraph {i} talks about topic number {i}." for i in range(200))
        msgs = [{"role": "system", "content": "You are a summariser."},
                {"role": "user", "content": "old question"}, {"role": "assistant", "content": "old answer"},
                {"role": "user", "content": doc + "\n\nSummarise this."}]
        opts = Options(temperature=0, num_predict=8, num_ctx=256)
        p = m.chat_prompt(msgs, opts)
        assert p.truncated and len(p.tokens) <= 128
        assert "<|im_start|>system\nYou are a summariser.<|im_end|>" in p.text
        assert "old question" not in p.text
        assert p.text.rstrip().endswith("<|im_start|>assistant") and "Summarise this." in p.text
        _, final = m.submit(p, opts).result()
        assert final.metrics.truncated and final.metrics.eval_count >= 1
        with pytest.raises(ContextError):
            m.submit(m.chat_prompt(msgs, opts.merged({"truncate": False})), opts.merged({"truncate": False}))
    finally:
        m.close()
