"""The answer is reused next turn where that is exact (issue 36 item 6; evalorder rule 3).

On a build where a row computes alike alone and inside a chunk (``Backend.answer_reuse``: ``ollapy info`` says
``answer reuse: yes (row-invariant build)``), a finished request's state keeps the generated tokens' KV cells, so
the next turn of a chat restores them and prefills only the new message and the template's turn markers.

* 20 three-turn conversations per test model: turn 3 with its prefix from the slot's own KV, the prompt cache's
  RAM tier or (a new cache object on the same directory, as a new process) its disk tier, in turn, prints exactly
  what the same turn prints cold, and the reused prefix reaches into turn 2's answer;
* through ``ollapy serve``'s ``/api/chat``: turn N+1's ``prompt_eval_count`` minus the tokens reused is exactly the
  new message plus its ChatML turn markers;
* Gemma 3 (sliding window) through two ``ollapy run`` processes sharing a cache directory: the second turn,
  restored in a new process with the first answer, prints what a ``--no-cache`` process prints;
* elsewhere the old rule holds (CPU flash attention here), and ``ollapy info`` names the rule in force.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import httpx
import pytest
from conftest import live_api, run_cli

from ollapy.cache import PromptCache
from ollapy.engine.model import LoadedModel
from ollapy.options import Options

TOPICS = ["apples", "rivers", "trains", "the moon", "bread", "chess", "owls", "copper", "rain", "music",
          "bridges", "tea", "glass", "wolves", "maps", "salt", "clocks", "sails", "honey", "stone"]
OPTS = Options(num_ctx=1024, num_parallel=1, temperature=0, num_predict=12)


class _Ref:
    def __init__(self, path):
        self.path, self.name, self.digest = path, "m", None


def _questions(i: int) -> list[str]:
    rng = random.Random(i)
    t = TOPICS[i % len(TOPICS)]
    return [f"Tell me one fact about {t}.", f"Why is that about {t} true? Number {rng.randrange(100)}.",
            f"Now say it again in {rng.choice(['three', 'five', 'seven'])} words."]


def _clear(m: LoadedModel) -> None:
    """Empty every slot, so a prefix can only come from the prompt cache."""
    for s in m.engine.slots:
        s.tokens, s.exact = [], 0
        m.backend.seq_clear(s.id)


def _bind(m: LoadedModel, root):
    cache = PromptCache(_Ref(m.path), OPTS, root=root).bind(m)
    m.engine.cache = cache
    return cache


def _decoded(m: LoadedModel, last) -> int:
    """Generated tokens whose KV a finished request holds: all of them, a token sampled at the num_predict limit
    too (one more decode row before the state is kept)."""
    return last.metrics.eval_count


@pytest.mark.parametrize("model_fixture", ["smollm2_path", "gemma_path"])
def test_turn_three_from_the_cache_equals_turn_three_cold(request, tmp_path, model_fixture):
    m = LoadedModel(request.getfixturevalue(model_fixture), OPTS)
    try:
        assert m.backend.answer_reuse, "this environment's build should be row-invariant (ollapy info)"
        cache = _bind(m, tmp_path)
        differ, whole = [], 0
        for i in range(20):
            msgs = [{"role": "system", "content": f"You are a helpful assistant. Conversation {i}."}]
            for turn, q in enumerate(_questions(i)):
                msgs.append({"role": "user", "content": q})
                p = m.chat_prompt(msgs)
                source = ("slot", "cache ram", "cache disk")[i % 3] if turn == 2 else "cache ram"
                if source == "cache disk":  # as a new process sees it
                    cache.write_back_now()
                    cache.flush()
                    cache = _bind(m, tmp_path)
                if source != "slot":
                    _clear(m)
                text, last = m.submit(p, OPTS).result()
                if turn == 1:
                    asked = len(p.tokens)
                    held = asked + _decoded(m, last)  # what turn 2's finished state holds
                if turn == 2:
                    # the restored prefix reaches into turn 2's answer (the old rule stops before its prompt's end)
                    reused = last.metrics.prompt_cache_tokens
                    assert asked < reused <= held, (i, reused, asked, held)
                    whole += reused == held
                    assert last.metrics.prefix_source == source, (i, last.metrics)
                    _clear(m)
                    cold, _ = m.submit(p, OPTS, cache=False).result()
                    if text != cold:
                        differ.append((i, text, cold))
                msgs.append({"role": "assistant", "content": text})
        assert not differ, f"{len(differ)} of 20 turn-3 answers differ from cold: {differ[:3]}"
        assert whole >= 15, f"only {whole} of 20 turn-3 prompts reused the whole of turn 2's answer"
    finally:
        m.close()


def test_elsewhere_the_answer_is_evaluated_again(smollm2_path, tmp_path):
    """CPU flash attention rounds one query row and many differently: the old rule (no answer reuse) stays."""
    opts = OPTS.merged({"flash_attn": "on"})
    m = LoadedModel(smollm2_path, opts)
    try:
        assert m.backend.row_invariant and not m.backend.answer_reuse
        _bind(m, tmp_path)
        system = " ".join(f"Rule {i}: answer politely and briefly, rule number {i}." for i in range(10))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": _questions(0)[0]}]
        p1 = m.chat_prompt(msgs)
        _clear(m)
        text, _ = m.submit(p1, opts).result()
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": _questions(0)[1]}]
        _clear(m)
        _, last = m.submit(m.chat_prompt(msgs), opts).result()
        assert 0 < last.metrics.prompt_cache_tokens < len(p1.tokens)
    finally:
        m.close()


def test_the_next_turn_prefills_only_the_new_message_and_its_turn_markers(tmp_path, smollm2_path):
    """Through ``ollapy serve``'s /api/chat, as a client sees it: ``prompt_eval_count - prompt_cache_tokens``."""
    from ollapy.engine.backend.context import Backend, ContextConfig

    b = Backend(smollm2_path, ContextConfig(n_parallel=1, num_ctx=256))
    try:
        def markers_and(q: str) -> int:  # ChatML: the end of the answer's turn, the user's turn, the assistant's header
            return len(b.tokenize(f"<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                                  add_special=False))
        questions = ["What is the capital of France? Answer in one word.", "And of Italy? Answer in one word.",
                     "And of Spain? Answer in one word.", "Which of the three is largest? One word."]
        expected = [markers_and(q) for q in questions]
    finally:
        b.close()
    with live_api(tmp_path, smollm2_path, {"smol": {}}) as api:
        msgs = [{"role": "system", "content": "You are a brief assistant."}]
        prev, cut = None, []
        for n, q in enumerate(questions):
            msgs.append({"role": "user", "content": q})
            r = httpx.post(api.url + "/api/chat", timeout=300, json={
                "model": "smol", "stream": False, "messages": msgs,
                "options": {"temperature": 0, "num_predict": 24, "num_ctx": 1024}})
            assert r.status_code == 200, r.text
            out = r.json()
            if prev is not None:
                # the whole previous answer, the token a num_predict cut left too (decoded before the state is kept)
                assert out["prompt_cache_tokens"] == prev["prompt_eval_count"] + prev["eval_count"], (n, out)
                assert out["prompt_eval_count"] - out["prompt_cache_tokens"] == expected[n], (n, out)
            cut.append(out["done_reason"] == "length")
            msgs.append({"role": "assistant", "content": out["message"]["content"]})
            prev = out
        assert any(cut[:-1]), cut  # at least one answer cut by num_predict was continued
        # the turns the slot's own KV served are not prompt-cache misses: only the first, cold, one is
        misses = re.search(r'^ollapy_prompt_cache_misses_total\{[^}]*\} (\S+)$', httpx.get(api.url + "/metrics").text, re.M)
        assert misses and float(misses.group(1)) == 1, misses


def _reused(stderr: bytes) -> int:
    m = re.search(rb"^prompt cache: +(\d+) token", stderr, re.M)
    return int(m.group(1)) if m else 0


def _count(stderr: bytes, what: bytes) -> int:
    return int(re.search(rb"^" + what + rb": +(\d+) token", stderr, re.M).group(1))


@pytest.mark.parametrize("system_lines", [8, 40], ids=["in-the-window", "past-the-window"])
def test_gemma_turn_restored_in_a_new_process_answers_as_a_cold_one(gemma_path, tmp_path, system_lines):
    """Two `ollapy run` processes share a prompt-cache directory and a --session: the second restores turn 1's
    prompt and answer from disk; a --no-cache process given the same session prints the same turn 2. The long
    system prompt puts turn 1 past Gemma's 512-token window, where the state's first in-window position is off
    the 64-token grid."""
    system = " ".join(f"Line {i}: the keeper logged wind {i * 7 % 40} knots and waves {i % 9} metres."
                      for i in range(system_lines))
    args = ["run", str(gemma_path), "--system", system, "--verbose", "-o", "temperature=0", "-o", "num_predict=24"]
    first = run_cli(*args, "--session", "a", input="Tell me about the sea.\n")
    assert first.returncode == 0, first.stderr.decode(errors="replace")[-2000:]
    src = next(Path(os.environ["XDG_STATE_HOME"]).glob("**/sessions/a.json"))  # conftest isolates the state dir
    shutil.copyfile(src, src.with_name("b.json"))
    held = _count(first.stderr, b"prompt eval count") + _count(first.stderr, b"eval count") - 1
    cached = run_cli(*args, "--session", "a", input="And about the wind?\n")
    cold = run_cli(*args, "--session", "b", "--no-cache", input="And about the wind?\n")
    for r in (cached, cold):
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    assert cached.stdout == cold.stdout
    reused = _reused(cached.stderr)
    assert _reused(cold.stderr) == 0
    # the whole turn, answer included, in the window or past it (where the state ends off the 64-token grid and
    # the restore places its window in the cold run's lanes: backend/window.py)
    assert reused >= held, (reused, held)
    assert json.loads(src.read_text())["messages"][-1]["role"] == "assistant"


def test_info_names_the_rule_in_force():
    r = run_cli("info", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["answer_reuse"] == "yes (row-invariant build)"
    r = run_cli("info", env={"GGML_CPU_TILED_MM": "1"})
    assert r.returncode == 0, r.stderr
    assert re.search(rb"^answer reuse: +no \(tiled K-quant matmul", r.stdout, re.M), r.stdout
    r = run_cli("info", "--json", env={"OLLAPY_KV_CACHE_TYPE": "q8_0"})
    assert json.loads(r.stdout)["answer_reuse"].startswith("no (kv_cache_type q8_0")


def test_info_says_no_on_a_stock_build(tmp_path, monkeypatch):
    import sys

    from ollapy.engine.backend import bindings
    from ollapy.engine.system import system_report

    if not bindings.build_has_llamafile():
        pytest.skip("a build without tinyBLAS has no one-row split")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # no patch marker there: a stock build
    bindings.patch_marker.cache_clear()
    try:
        assert system_report("off")["answer_reuse"] == "no (stock build)"
    finally:
        bindings.patch_marker.cache_clear()


def test_a_continued_turn_writes_one_state_and_reaches_the_disk(smollm2_path, tmp_path):
    """A turn that continues from its slot's KV (the previous turn's finished state, RAM-only) writes one state:
    its own turn end, a save point that extends the finished state. Writing the finished state first as well
    (promoting it on reuse) wrote the same tail twice each turn (issue 36's 10-turn row). The conversation still
    reaches the disk: a new cache on the directory (a new process) restores the last turn's prompt."""
    opts = OPTS.merged({"num_ctx": 2048})
    m = LoadedModel(smollm2_path, opts)
    try:
        cache = _bind(m, tmp_path)
        system = " ".join(f"Rule {i}: answer politely and briefly, rule number {i}." for i in range(12))
        msgs = [{"role": "system", "content": system}]
        per_turn = []
        for turn in range(3):  # each turn more than a block (256 tokens) past the last: worth promoting
            notes = " ".join(f"Note {turn}.{i}: the reader borrowed volume {turn * 7 + i} on day {i}." for i in range(24))
            msgs.append({"role": "user", "content": f"{notes} Which volume did I borrow last?"})
            p = m.chat_prompt(msgs)
            before = cache.stats.snapshot()
            text, last = m.submit(p, opts).result()
            cache.flush()
            after = cache.stats.snapshot()
            per_turn.append((after.files_written - before.files_written, last.metrics.prefix_source))
            msgs.append({"role": "assistant", "content": text})
        # turn 1: the system prompt and nothing else persisted (the one-off answer stays in RAM); turns 2, 3:
        # continued from the slot, one state each (the previous turn's end, answer included)
        assert per_turn == [(1, "none"), (1, "slot"), (1, "slot")], per_turn
        cache.flush()
        fresh = _bind(m, tmp_path)  # as a new process sees the directory
        fresh.refresh()
        _clear(m)
        _, last = m.submit(p, opts).result()
        # everything up to the last turn's user message: turn 2's end, answer included, was written by turn 3
        assert last.metrics.prefix_source == "cache disk", last.metrics
        assert max(p.save_points) - 4 <= last.metrics.prompt_cache_tokens <= max(p.save_points), (p.save_points,
                                                                                                   last.metrics)
    finally:
        m.close()


def test_a_sliding_window_answer_state_ends_before_trailing_whitespace(gemma_path):
    """Gemma's template trims an answer (``| trim``) when it renders it back, and a sliding-window state serves
    only whole: the finished state ends before the answer's trailing whitespace tokens, never inside the prompt."""
    from ollapy.engine.bookkeeping import SlotBookkeeping
    from ollapy.engine.slot import Slot

    m = LoadedModel(gemma_path, Options(num_ctx=512, num_parallel=1))
    try:
        b = m.backend
        prompt = m.chat_prompt([{"role": "user", "content": "Capital of France?"}]).tokens
        answer = b.tokenize("Paris is the capital.\n\n", add_special=False)
        keeper = SlotBookkeeping()
        keeper.backend = b
        slot = Slot(0, tokens=prompt + answer, prompt=list(prompt), exact=len(prompt) + len(answer))
        end = keeper._answer_end(slot)
        assert len(prompt) < end < slot.exact
        assert b"".join(b.token_piece(t) for t in slot.tokens[len(prompt):end]) == b"Paris is the capital."
        assert b.token_piece(prompt[-1]).endswith(b"\n")  # the prompt ends in a newline ("model\n"): kept
        slot = Slot(0, tokens=list(prompt), prompt=list(prompt), exact=len(prompt))
        assert keeper._answer_end(slot) == len(prompt)
    finally:
        m.close()


def test_a_sliding_window_answer_state_ends_where_its_text_stops_tokenizing_the_same(gemma_path):
    """A word the model spelled in pieces the tokenizer would not choose (or one ``num_predict`` cut) is
    rendered back as the tokenizer's own tokens: the state ends before it, so the next prompt still holds all of
    it."""
    from ollapy.engine.bookkeeping import SlotBookkeeping
    from ollapy.engine.slot import Slot

    m = LoadedModel(gemma_path, Options(num_ctx=512, num_parallel=1))
    try:
        b = m.backend
        prompt = m.chat_prompt([{"role": "user", "content": "Capital of France?"}]).tokens
        head = b.tokenize("Paris is the", add_special=False)
        whole = b.tokenize(" capital", add_special=False)
        pieces = b.tokenize(" cap", add_special=False) + b.tokenize("ital", add_special=False)
        assert len(whole) == 1 and len(pieces) == 2  # the tokenizer's choice is one token, the model's two
        keeper = SlotBookkeeping()
        keeper.backend = b
        canonical = prompt + head + whole
        slot = Slot(0, tokens=list(canonical), prompt=list(prompt), exact=len(canonical))
        assert keeper._answer_end(slot) == len(canonical)  # the answer as the tokenizer spells it: kept whole
        spelled = prompt + head + pieces
        slot = Slot(0, tokens=list(spelled), prompt=list(prompt), exact=len(spelled))
        end = keeper._answer_end(slot)
        assert len(prompt) <= end <= len(prompt) + len(head)
        rendered = b.tokenize(b"".join(b.token_piece(t) for t in spelled[len(prompt) - 2:]).decode(),
                              add_special=False, parse_special=False)
        assert spelled[len(prompt) - 2:end] == rendered[:end - len(prompt) + 2]  # a prefix of what comes back
    finally:
        m.close()
