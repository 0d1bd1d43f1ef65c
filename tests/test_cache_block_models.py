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


def test_a_gemma_conversation_writes_its_system_prompt_then_its_newest_save_point(gemma_path, tmp_path):
    """Issue 36 item 7, on Gemma 3 (sliding window 512: each state carries ~8 MB of window): three turns past the
    window write the system prompt's state at once and nothing else while the conversation goes on (its save points
    and checkpoints supersede each other in RAM); closing the cache writes the newest one, and a new cache (a new
    process) resumes the conversation from it, answering as a cold run."""
    opts = Options(num_ctx=4096, num_parallel=1, temperature=0, num_predict=16)
    with LoadedModel(gemma_path, opts) as m:
        c = PromptCache(_Ref(m.path), opts, root=tmp_path).bind(m)
        m.engine.cache = c
        msgs = [{"role": "system", "content": SYSTEM}]
        files = []
        try:
            for turn in range(3):
                notes = " ".join(f"Note {turn}.{i}: volume {turn * 7 + i} was lent on day {i}." for i in range(30))
                msgs.append({"role": "user", "content": f"{notes} Which volume was lent last?"})
                text, last = m.submit(m.chat_prompt(msgs), opts).result()
                c.disk.flush(60)
                files.append(c.snapshot().files_written)
                msgs.append({"role": "assistant", "content": text})
            assert files == [1, 1, 1], files  # the system prompt's state only
            assert c.snapshot().superseded >= 2
            assert c.snapshot().continued >= 1  # turn 1's state, once turn 3's took over (turn 2's carries the write)
        finally:
            c.close()
            m.engine.cache = None
        u = block_usage(tmp_path)
        assert u["entries"] == 2, u  # the system prompt and the conversation's newest save point
        msgs.append({"role": "user", "content": "And which one came first?"})
        prompt = m.chat_prompt(msgs)
        _clear(m)
        cold, _ = m.submit(prompt, opts, cache=False).result()
        _clear(m)
        c2 = PromptCache(_Ref(m.path), opts, root=tmp_path).bind(m)
        m.engine.cache = c2
        try:
            warm, last = m.submit(prompt, opts).result()
            assert last.metrics.prefix_source == "cache disk", last.metrics
            assert last.metrics.prompt_cache_tokens > len(prompt.tokens) - 400, (last.metrics, len(prompt.tokens))
            assert warm == cold
        finally:
            c2.close()
            m.engine.cache = None


def test_interleaved_gemma_conversations_keep_their_newest_state_and_answer_as_cold(gemma_path, tmp_path):
    """Two Gemma conversations taking turns on one slot: each turn restores its conversation's previous finished
    state from RAM, and that state gives way to the new one (one window per conversation in RAM, not one per turn).
    The third turn, restored from what is left, answers as a cold run."""
    opts = Options(num_ctx=4096, num_parallel=1, temperature=0, num_predict=12)
    with LoadedModel(gemma_path, opts) as m:
        c = PromptCache(_Ref(m.path), opts, root=tmp_path).bind(m)
        m.engine.cache = c
        convs = {k: [{"role": "system", "content": SYSTEM}] for k in "ab"}
        try:
            for turn in range(3):
                for k, msgs in convs.items():
                    notes = " ".join(f"Note {k}{turn}.{i}: crate {turn * 9 + i} left on day {i}." for i in range(25))
                    msgs.append({"role": "user", "content": f"{notes} Which crate left last?"})
                    prompt = m.chat_prompt(msgs)
                    if turn == 2 and k == "b":
                        slot_tokens = list(m.engine.slots[0].tokens)
                        _clear(m)
                        cold, _ = m.submit(prompt, opts, cache=False).result()
                        _clear(m)
                        m.engine.slots[0].tokens = []  # the slot held conversation a: b restores from the cache
                        assert slot_tokens  # (a's turn ran just before)
                    text, last = m.submit(prompt, opts).result()
                    if turn:
                        assert last.metrics.prefix_source == "cache ram", last.metrics
                    if turn == 2 and k == "b":
                        assert text == cold
                    msgs.append({"role": "assistant", "content": text})
            snap = c.snapshot()
            assert snap.continued >= 3, snap  # each restored finished state gave way to the next (the last of b too)
            for k, msgs in convs.items():  # its finished states held in RAM (checkpoints lie on the 512 grid)
                whole = m.chat_prompt(msgs + [{"role": "user", "content": "And the first?"}]).tokens
                first = len(m.chat_prompt(msgs[:2]).tokens)
                held = [len(e.tokens) for e in c.entries.values() if e.payload is not None and len(e.tokens) % 512
                        and len(e.tokens) > first and whole[:len(e.tokens)] == e.tokens]
                assert len(held) == 1, (k, held)  # turn 3's; turns 1 and 2 gave way
        finally:
            c.close()
            m.engine.cache = None
