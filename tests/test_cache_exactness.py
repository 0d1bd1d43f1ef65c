"""A prompt-cache hit never changes the answer: through the real entry points, on both test models.

For each model, five system prompts of different lengths (seeded random sentences), each answered three times
by new `ollapy run` processes sharing one cache directory: cold (nothing cached), again (a new process that
hits the cache), then `--no-cache`. The three greedy answers must be byte-identical, and the second run must
have reused the prefix. The same holds through `ollapy serve` across a restart.

This is what the canonical evaluation order (ollapy/engine/prefix/evalorder.py) buys; before it, a hit or a cache that
was merely on changed 1 to 2 answers in 5 on these models. Timeouts only guard against hangs.
"""
from __future__ import annotations

import random
import re

import pytest
from conftest import live_server, run_cli

pytestmark = pytest.mark.slow

SUBJECTS = ["The courier", "The keeper", "A clerk", "The pilot", "The baker", "A guard", "The mayor", "The nurse"]
VERBS = ["delivers to", "writes about", "walks to", "repairs", "counts", "visits", "paints", "guards"]
OBJECTS = ["street", "house", "ship", "bridge", "kettle", "book", "tower", "garden"]


def system_prompt(lines: int, seed: int) -> str:
    """``lines`` seeded random sentences with numbers (the kind of fact list a script sends)."""
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(SUBJECTS)} with badge {rng.randrange(100)} {rng.choice(VERBS)} "
                    f"{rng.choice(OBJECTS)} {rng.randrange(300)}." for _ in range(lines))


CASES = [(11, 1), (23, 2), (41, 3), (67, 4), (97, 5)]
QUESTION = "Which street does the courier with the lowest badge deliver to? Answer in one sentence."


def _reused(stderr: bytes) -> int:
    m = re.search(rb"^prompt cache: +(\d+) token", stderr, re.M)
    return int(m.group(1)) if m else 0


def _run(model, system: str, *extra: str):
    r = run_cli("run", str(model), "--system", system, "--verbose", "-o", "temperature=0", "-o", "num_predict=40",
                *extra, input=QUESTION + "\n")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    return r.stdout, _reused(r.stderr)


@pytest.mark.parametrize("model_fixture", ["smollm2_path", "gemma_path"])
@pytest.mark.parametrize("lines,seed", CASES, ids=[f"{n}-lines" for n, _ in CASES])
def test_cold_cached_and_no_cache_runs_print_the_same_answer(request, model_fixture, lines, seed):
    model = request.getfixturevalue(model_fixture)
    system = system_prompt(lines, seed)
    cold, reused_cold = _run(model, system)
    cached, reused = _run(model, system)
    nocache, reused_nocache = _run(model, system, "--no-cache")
    assert reused_cold == 0 and reused_nocache == 0
    assert reused >= 10 * lines  # a new process restored the system prompt (about 20 tokens a line)
    assert cold == cached == nocache, (cold, cached, nocache)


def test_a_server_restart_restores_the_prefix_and_answers_the_same(tmp_path, smollm2_path, gemma_path):
    import httpx

    system = system_prompt(60, 9)

    def ask(url: str, model: str) -> dict:
        body = {"model": model, "stream": False, "system": system, "prompt": QUESTION,
                "options": {"temperature": 0, "num_predict": 40}}
        r = httpx.post(url + "/api/generate", json=body, timeout=900)
        assert r.status_code == 200, r.text
        return r.json()

    models = {"smol": smollm2_path, "gemma": gemma_path}
    with live_server(tmp_path, "--allow-paths") as url:
        first = {m: ask(url, str(p)) for m, p in models.items()}
    with live_server(tmp_path, "--allow-paths") as url:
        second = {m: ask(url, str(p)) for m, p in models.items()}
    with live_server(tmp_path, "--allow-paths", env={"OLLAPY_CACHE": "0"}) as url:
        nocache = {m: ask(url, str(p)) for m, p in models.items()}
    for m in models:
        assert first[m].get("prompt_cache_tokens", 0) == 0
        assert second[m]["prompt_cache_tokens"] >= 600, (m, second[m])
        assert first[m]["response"] == second[m]["response"] == nocache[m]["response"], m


def test_gemma_partial_reuse_after_a_restart_matches_a_cold_server(tmp_path, gemma_path):
    """Sliding-window states serve only whole; a prompt sharing two thirds of a 1,500-token prefix reuses the
    shared part in the same server (the slot's own cells, trimmed anywhere: every cell sits where the first
    request put it), and the newest context checkpoint (every 512 tokens), written at shutdown (the others' writes
    were superseded: write-behind, ollapy.cache.policy), lets the same prompt after a restart restore it; both
    answer exactly as a cold server."""
    import httpx

    sentences = [f"Line {i}: the keeper logged wind speed {i * 7 % 40} knots and wave height {i % 9} metres."
                 for i in range(80)]
    full = " ".join(sentences) + " Summary of line 5:"
    part = " ".join(sentences[:50]) + " Summary of line 3:"

    def ask(url: str, prompt: str) -> dict:
        body = {"model": str(gemma_path), "raw": True, "stream": False, "prompt": prompt,
                "options": {"temperature": 0, "num_predict": 24, "num_ctx": 2048}}
        r = httpx.post(url + "/api/generate", json=body, timeout=900)
        assert r.status_code == 200, r.text
        return r.json()

    with live_server(tmp_path, "--allow-paths") as url:
        first = ask(url, full)
        partial = ask(url, part)
    assert 1400 <= first["prompt_eval_count"] < 2048
    with live_server(tmp_path, "--allow-paths") as url:
        again = ask(url, full)
    with live_server(tmp_path / "cold", "--allow-paths", env={"OLLAPY_CACHE": "0"}) as url:
        cold = ask(url, part)
    # a server keeps a finished request's state in RAM only: after the restart the persisted checkpoint serves
    last_checkpoint = (first["prompt_eval_count"] - 2) // 512 * 512
    assert again["prompt_cache_tokens"] == last_checkpoint and again["response"] == first["response"]
    # the shared part (the first 50 of 80 lines, about 1,030 tokens), at least the checkpoint below it
    assert 1024 <= partial["prompt_cache_tokens"] < partial["prompt_eval_count"]
    assert partial["response"] == cold["response"]
