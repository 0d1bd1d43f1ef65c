"""The block pool on real models: conversations that share a system prompt store its KV blocks once, and a
restore joined from blocks (RAM, and disk in a new cache) answers exactly as a cold run (SmolLM2, Gemma 3)."""
from __future__ import annotations

import pytest

from ollapy.cache import PromptCache
from ollapy.cache.diskcap import block_usage
from ollapy.engine.model import LoadedModel
from ollapy.options import Options

SYSTEM = " ".join(f"Rule {i}: answer politely, briefly and truthfully, rule number {i}." for i in range(60))
QUESTIONS = ["What is the capital of France? Answer in one word.", "What is 2 plus 2? Answer with a number.",
             "Name a colour of the sky.", "Which animal barks?"]
OPTS = Options(num_ctx=2048, num_parallel=1, temperature=0, num_predict=8)
B = 64


class _Ref:
    def __init__(self, path):
        self.path, self.name, self.digest = path, "m", None


def _clear(m: LoadedModel) -> None:
    for s in m.engine.slots:
        s.tokens = []
        s.exact = 0
        m.backend.seq_clear(s.id)


def _answer(m: LoadedModel, q: str, cache: bool = True):
    _clear(m)
    prompt = m.chat_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
    text, last = m.submit(prompt, OPTS, cache=cache).result()
    return text, last.metrics


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_shared_system_prompt_blocks_are_stored_once_and_restore_exactly(which, smollm2_path, gemma_path, tmp_path):
    path = smollm2_path if which == "smollm2" else gemma_path
    with LoadedModel(path, OPTS) as m:
        cold = [_answer(m, q, cache=False)[0] for q in QUESTIONS]
        c = PromptCache(_Ref(m.path), OPTS, root=tmp_path, block_tokens=B).bind(m)
        m.engine.cache = c
        try:
            warm = []
            for q in QUESTIONS:
                text, met = _answer(m, q)
                warm.append(text)
            assert warm == cold
            assert c.snapshot().hits_ram + c.snapshot().hits_disk >= len(QUESTIONS) - 1
            c.write_back_now()
            c.flush()
            snap = c.snapshot()
            assert snap.whole_states == 0 and snap.ram_blocks > 0
            assert snap.ram_shared_bytes > 0  # the system prompt's blocks, held once by several entries
            assert snap.ram_logical_bytes > snap.ram_bytes
        finally:
            c.close()
            m.engine.cache = None
        u = block_usage(tmp_path)
        assert u["entries"] >= 2 and u["blocks"] > 0 and u["whole_entries"] == 0
        c2 = PromptCache(_Ref(m.path), OPTS, root=tmp_path, block_tokens=B).bind(m)  # a new cache: from disk
        m.engine.cache = c2
        try:
            text, met = _answer(m, QUESTIONS[0])
            assert met.prefix_source == "cache disk" and met.prompt_cache_tokens >= B
            assert text == cold[0]
        finally:
            c2.close()
            m.engine.cache = None
