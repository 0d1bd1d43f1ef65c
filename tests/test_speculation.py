"""Speculative decoding in the engine (issue 22), on the real test models: drafting never changes an answer.

Greedy (and seeded) output with drafting is token-identical to plain decoding, because a verified row's logits
are bit-identical to a one-row step's (checked directly below) and the slot's own sampler verifies row after
row. Also: num_predict, stop strings across a draft boundary, grammars, logprobs, a draft model (refused for
another vocabulary; kept in step after a cache restore and a context shift), and the statistics of sampling.
"""
from __future__ import annotations

import json
import os
import re
import time
from array import array
from dataclasses import replace

import numpy as np
import pytest
from conftest import run_cli

from ollapy.engine.backend.context import Backend, ContextConfig
from ollapy.engine.model import LoadedModel
from ollapy.engine.spec.policy import StepCost
from ollapy.errors import DraftMismatch
from ollapy.options import Options

LOG = "".join(f"Line {i}: the keeper logged wind speed {3 + (i * 7) % 37} knots and wave height {1 + i % 8}.{i % 10} "
              f"metres at the north light.\n" for i in range(1, 13))
COPY = ("Repeat this paragraph exactly: The lighthouse at Skerry Point was built in 1851 from granite quarried on the "
        "island itself. Its lamp burned colza oil until 1904, when a paraffin vapour burner replaced it.")


def _generate(model: LoadedModel, text: str, raw: bool = True, fmt=None, logprobs: int = -1, **opts):
    """(text, tokens generated, metrics, logprobs) of one request."""
    prompt = model.raw_prompt(text) if raw else model.chat_prompt([{"role": "user", "content": text}])
    req = model.submit(prompt, replace(model.options, **opts), fmt=fmt, cache=False, logprobs=logprobs)
    parts, lps, last = [], [], None
    for c in req:
        parts.append(c.text)
        lps.extend(c.logprobs or [])
        last = c
    return "".join(parts), list(req.output_tokens), last.metrics, lps


#: a step-cost line pinned for these tests: extra rows nearly free, so the policy drafts whatever the machine's
#: load (the policy itself is tested in test_draft_policy.py); identity must hold whenever it drafts
CHEAP_ROWS = StepCost(1.0, 0.05)


def _open(path, draft_path=None, **opts) -> LoadedModel:
    m = LoadedModel(path, Options(**opts), draft_path=draft_path)
    m.engine.spec.pin_cost(CHEAP_ROWS)
    return m


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with _open(smollm2_path, num_ctx=1024, temperature=0, repeat_penalty=1.0) as m:
        yield m


@pytest.fixture(scope="module")
def gemma(gemma_path):
    with _open(gemma_path, num_ctx=1024, temperature=0) as m:
        yield m


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_a_verified_row_gives_the_logits_of_a_one_row_step(request, which):
    """The invariant drafting rests on: each row of a 1..12-row verification batch equals the one-row decode
    step of the same token, bit for bit (Gemma's K-quant weights would take ggml-cpu's tiled kernel from 8
    rows up unless it is off)."""
    path = request.getfixturevalue(f"{which}_path")
    with Backend(path, ContextConfig(n_parallel=2, num_ctx=512, num_batch=256)) as b:
        assert b.row_invariant, "tinyBLAS, tiled K-quant matmul or repacked weights on: see engine/speculation.py"
        toks = b.tokenize(LOG)[:200]
        n = len(toks)
        for seq in (0, 1):
            b.decode(array("i", toks), array("i", range(n)), array("i", [seq] * n), array("b", [0] * n))
        cont = b.tokenize(LOG[400:700], add_special=False, parse_special=False)[:12]
        one = []
        for i, t in enumerate(cont):  # plain decoding on seq 0: one row per step
            b.decode(array("i", [t]), array("i", [n + i]), array("i", [0]), array("b", [1]))
            one.append(b.logits_row(0).copy())
        for k in (2, 5, 8, 12):  # seq 1: the same tokens as one verification batch of k rows
            b.seq_rm(1, n, -1)
            b.decode(array("i", cont[:k]), array("i", range(n, n + k)), array("i", [1] * k), array("b", [1] * k))
            for i in range(k):
                row = b.logits_row(i)
                assert np.array_equal(one[i], row), f"{k} rows: row {i} differs by {np.abs(one[i] - row).max()}"


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_greedy_ngram_drafting_is_token_identical(request, which):
    model = request.getfixturevalue(which)
    text = LOG if which == "gemma" else COPY
    raw = which == "gemma"
    plain = _generate(model, text, raw=raw, num_predict=96)
    drafted = _generate(model, text, raw=raw, num_predict=96, draft="ngram")
    assert drafted[1] == plain[1] and drafted[0] == plain[0]
    m = drafted[2]
    assert m.draft == "ngram" and m.draft_tokens > 0 and 0 < m.draft_accepted <= m.draft_tokens
    assert plain[2].draft == "" and plain[2].draft_tokens == 0
    assert m.eval_count == plain[2].eval_count


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8, 13])
def test_num_predict_is_exact_with_drafting(gemma, limit):
    plain = _generate(gemma, LOG, num_predict=limit)
    drafted = _generate(gemma, LOG, num_predict=limit, draft="ngram", draft_num_predict=6)
    assert len(drafted[1]) == limit == drafted[2].eval_count
    assert drafted[1] == plain[1]


def test_stop_strings_across_draft_boundaries_end_where_plain_decoding_ends(gemma):
    full, toks, _, _ = _generate(gemma, LOG, num_predict=60)
    # stop strings that start at each of several places in the plain answer (some inside a drafted run)
    for start in (5, 17, 30, 44):
        stop = full[start:start + 9]
        if not stop.strip() or full.find(stop) != start:
            continue
        plain = _generate(gemma, LOG, num_predict=60, stop=[stop])
        drafted = _generate(gemma, LOG, num_predict=60, stop=[stop], draft="ngram")
        assert plain[0] == full[:start] == drafted[0]
        assert drafted[2].draft_accepted > 0


def test_a_grammar_constrained_answer_is_the_same_with_drafting(smollm2):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["name", "year"]}
    q = "The lighthouse at Skerry Point was built in 1851. Give its name and year as JSON."
    plain = _generate(smollm2, q, raw=False, fmt=schema, num_predict=60)
    drafted = _generate(smollm2, q, raw=False, fmt=schema, num_predict=60, draft="ngram")
    assert drafted[0] == plain[0] and drafted[1] == plain[1]
    assert set(json.loads(drafted[0])) >= {"name", "year"}


def test_logprobs_are_the_same_with_drafting(gemma):
    plain = _generate(gemma, LOG, num_predict=24, logprobs=2)
    drafted = _generate(gemma, LOG, num_predict=24, logprobs=2, draft="ngram")
    assert drafted[2].draft_accepted > 0
    assert [(p.token, p.logprob, p.top) for p in drafted[3]] == [(p.token, p.logprob, p.top) for p in plain[3]]


def test_seeded_sampling_with_drafting_draws_the_same_tokens_and_distribution(gemma):
    """The slot's sampler verifies row by row, so it draws the same random numbers as plain decoding: per seed
    the tokens are identical, and so (chi-square over 40 seeds on the 8 most frequent first-divergence
    tokens) is the distribution."""
    counts_plain: dict[int, int] = {}
    counts_draft: dict[int, int] = {}
    accepted = 0
    for seed in range(40):
        opts = dict(num_predict=12, temperature=1.0, top_k=40, top_p=1.0, seed=seed)
        plain = _generate(gemma, LOG, **opts)
        drafted = _generate(gemma, LOG, draft="ngram", **opts)
        assert drafted[1] == plain[1], seed
        accepted += drafted[2].draft_accepted
        for c, toks in ((counts_plain, plain[1]), (counts_draft, drafted[1])):
            for t in toks:
                c[t] = c.get(t, 0) + 1
    assert accepted > 0
    top = sorted(counts_plain, key=counts_plain.get, reverse=True)[:8]
    a = np.array([counts_plain[t] for t in top], dtype=float)
    b = np.array([counts_draft.get(t, 0) for t in top], dtype=float)
    chi2 = float(((a - b) ** 2 / np.maximum(a + b, 1)).sum())
    assert chi2 < 14.07  # 7 degrees of freedom, p = 0.05


@pytest.mark.parametrize("opts", [
    dict(temperature=0, dry_multiplier=0.8),
    dict(temperature=0.8, seed=3, dry_multiplier=0.8, xtc_probability=0.5, xtc_threshold=0.1, top_n_sigma=2.0),
    dict(temperature=0.8, seed=4, dry_multiplier=0.8, dry_allowed_length=4, xtc_probability=0.5,
         logit_bias=(("Line", -5.0), (28, float("-inf")))),
], ids=["greedy-dry", "seeded-dry-xtc-sigma", "seeded-logit-bias"])
def test_drafting_with_llama_cpp_samplers_is_token_identical(smollm2, opts):
    """DRY, XTC, top-n-sigma and a logit bias sit in the slot's sampler chain, which verifies drafted rows as it
    samples plain ones (issue 56): with them on, drafting draws exactly the tokens plain decoding draws."""
    plain = _generate(smollm2, LOG, num_predict=40, **opts)
    drafted = _generate(smollm2, LOG, num_predict=40, draft="ngram", **opts)
    assert drafted[1] == plain[1] and drafted[0] == plain[0]
    assert drafted[2].draft_accepted > 0


def test_four_concurrent_drafting_requests_answer_as_plain_ones(gemma_path):
    with _open(gemma_path, num_ctx=512, num_parallel=4, temperature=0) as m:
        prompts = [LOG, LOG.replace("north", "south"), LOG[:600], LOG.replace("keeper", "warden")]
        limits = (40, 60, 80, 120)  # four slots decode together, then fewer (the policy drafts more when alone)

        def answers(**opts) -> list[list[int]]:
            reqs = [m.submit(m.raw_prompt(p), replace(m.options, num_predict=n, **opts), cache=False)
                    for p, n in zip(prompts, limits)]
            for r in reqs:
                assert list(r)[-1].done
            return [list(r.output_tokens) for r in reqs]

        plain = answers()
        drafted = answers(draft="ngram")
        assert drafted == plain
        assert m.engine.spec.accepted > 0


def test_draft_model_drafts_and_answers_as_plain_decoding(smollm2_path):
    """Plumbing with the model as its own draft (acceptance near 100% at temperature 0, as the issue allows)."""
    with _open(smollm2_path, smollm2_path, num_ctx=512, temperature=0, repeat_penalty=1.0, draft=str(smollm2_path)) as m:
        plain = _generate(m, COPY, raw=False, num_predict=48, draft="")
        drafted = _generate(m, COPY, raw=False, num_predict=48)
        assert drafted[1] == plain[1]
        m2 = drafted[2]
        assert m2.draft == "model" and m2.draft_tokens > 20 and m2.draft_accepted >= 0.9 * m2.draft_tokens
        dm = m.engine.spec.draft_model
        prompt = m.chat_prompt([{"role": "user", "content": COPY}]).tokens
        # the draft sequence holds a prefix of the slot's prompt plus accepted output (never a rejected token)
        held = dm.held(0)
        assert len(held) > len(prompt) and held == (prompt + drafted[1])[:len(held)]
        # a second request reuses the slot's prefix (the target trimmed it; the draft sequence is cut to match)
        again = _generate(m, COPY, raw=False, num_predict=48)
        assert again[1] == plain[1] and again[2].prompt_cache_tokens > 0 and again[2].draft_accepted > 0
        held = dm.held(0)
        assert held == (prompt + again[1])[:len(held)]
        # what it holds, as /api/ps and `ollapy ps` show it: the draft model's weights and KV cache count too
        from ollapy.server.scheduler import loaded_size

        info, d = m.info(), m.draft_backend
        assert info["draft_size"] == d.model_size() + d.kv_bytes_per_token() * 512 > d.model_size() > 50_000_000
        assert loaded_size(m) == info["size"] + info["kv_bytes_per_slot"] + info["draft_size"]


def test_a_cut_draft_model_changes_nothing_whatever_it_proposes(smollm2_path, smollm2_draft_path):
    with _open(smollm2_path, smollm2_draft_path, num_ctx=512, temperature=0, repeat_penalty=1.0,
               draft=str(smollm2_draft_path)) as m:
        plain = _generate(m, COPY, raw=False, num_predict=48, draft="")
        drafted = _generate(m, COPY, raw=False, num_predict=48)
        assert drafted[1] == plain[1] and drafted[2].draft_tokens > 0


def test_a_draft_model_evaluates_the_prompt_with_the_prompt_not_in_the_first_drafting_step(smollm2_path,
                                                                                            smollm2_draft_path):
    """The draft's prompt evaluation is prompt processing (llama.cpp's speculative example encodes the prompt on
    both models before timing generation): without it the first drafting step of every new `ollapy run` paid
    for the whole prompt, and the draft-model row of bench_spec ran at 0.86-0.89x plain though it drafted once."""
    with _open(smollm2_path, smollm2_draft_path, num_ctx=512, temperature=0, repeat_penalty=1.0,
               draft=str(smollm2_draft_path)) as m:
        dm = m.engine.spec.draft_model
        calls: list[tuple[dict[int, int], int]] = []
        propose = dm.propose

        def spy(requests):
            before = dm.stats.synced
            out = propose(requests)
            calls.append(({s: n for s, (_, n) in requests.items()}, dm.stats.synced - before))
            return out

        dm.propose = spy
        prompt = m.chat_prompt([{"role": "user", "content": COPY}]).tokens
        plain = _generate(m, COPY, raw=False, num_predict=24, draft="")
        assert calls == []  # a request that does not draft never touches the draft model
        drafted = _generate(m, COPY, raw=False, num_predict=24)
        assert drafted[1] == plain[1] and drafted[2].draft_tokens > 0
        assert calls[0] == ({0: 0}, len(prompt))  # the whole prompt, drafting nothing, before the first token
        assert calls[1][0][0] > 0 and calls[1][1] == 1  # the first draft evaluates only the pending token


def test_draft_model_follows_a_context_shift(smollm2_path):
    opts = dict(num_ctx=128, temperature=0, repeat_penalty=1.0, draft=str(smollm2_path), num_keep=8)
    with _open(smollm2_path, smollm2_path, **opts) as m:
        plain = _generate(m, "Count from 1 to 100: 1, 2, 3, 4,", num_predict=200, draft="", shift=True)
        drafted = _generate(m, "Count from 1 to 100: 1, 2, 3, 4,", num_predict=200, shift=True)
        assert plain[2].shifts > 0 and drafted[2].shifts == plain[2].shifts
        assert drafted[1] == plain[1] and drafted[2].draft_accepted > 0
        assert m.engine.spec.draft_model.stats.cleared == 0  # shifted in place, never re-prefilled


def test_a_draft_model_of_another_vocabulary_is_refused_in_one_line(smollm2_path, gemma_path):
    with pytest.raises(DraftMismatch) as exc:
        LoadedModel(smollm2_path, Options(num_ctx=256, draft=str(gemma_path)), draft_path=gemma_path)
    assert "does not share the vocabulary" in exc.value.message and "\n" not in exc.value.message
    r = run_cli("run", str(smollm2_path), "-o", f"draft={gemma_path}", "hi")
    err = r.stderr.decode().strip()
    assert r.returncode == 2 and len(err.splitlines()) <= 2 and "does not share the vocabulary" in err
    assert smollm2_path.name in err and gemma_path.name in err


def test_a_server_refuses_a_draft_of_another_vocabulary_without_unloading_its_model(tmp_path, smollm2_path,
                                                                                      smollm2_draft_path, gemma_path):
    """Found by fresh-user trials: a request naming a draft model of another vocabulary drained and unloaded the
    loaded model, and only then did the load fail; first for another tokenizer, then (with only the tokenizer
    type and size compared first) for another BOS handling. The GGUF headers are compared by llama.cpp's whole
    rule first (loader.checked_draft_path): a one-line 400, the model stays loaded (the next request loads
    nothing), and the CLI asking that server exits 2 as it does when it loads the models itself. A relative
    ``-o draft=./x.gguf`` is the CLI user's working directory's, not the server's."""
    import shutil

    import httpx
    from conftest import edited_gguf_copy, live_server

    from ollapy.store.info import read_gguf_header

    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\n")
    env = {"OLLAPY_MODELS": str(tmp_path / "models")}
    assert run_cli("create", "smol", "-f", str(tmp_path / "Modelfile"), env=env).returncode == 0
    adds_bos = bool(read_gguf_header(smollm2_path)[0]["tokenizer.ggml.add_bos_token"])
    other_bos = edited_gguf_copy(smollm2_draft_path, tmp_path / "bos.gguf", "tokenizer.ggml.add_bos_token",
                                 value=int(not adds_bos))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(smollm2_draft_path, work / "cut.gguf")

    def ask(**opts) -> httpx.Response:
        return httpx.post(url + "/api/generate", timeout=600, json={
            "model": "smol", "prompt": "Hi", "stream": False, "options": {"num_predict": 4, **opts}})

    with live_server(tmp_path, "--allow-paths", env={"OLLAPY_CACHE": "0"}) as url:
        first = ask()
        assert first.status_code == 200 and first.json()["load_duration"] > 0
        for draft, why in ((gemma_path, "tokenizer SentencePiece (SPM) vs byte-level BPE"),
                           (other_bos, "BOS token ")):
            refused = ask(draft=str(draft))
            error = refused.json()["error"]
            assert refused.status_code == 400 and "\n" not in error, error
            # a path the client sent is named by its file name: never a server path, still which draft
            assert error.startswith(f"draft model {draft.name} does not share the vocabulary of smol:latest ({why}"), \
                error
            assert [m["name"] for m in httpx.get(url + "/api/ps", timeout=30).json()["models"]] == ["smol:latest"]
            again = ask()
            assert again.status_code == 200 and again.json()["load_duration"] == 0  # never unloaded
        host = {"OLLAPY_HOST": url[len("http://"):]}
        r = run_cli("run", "smol", "-o", f"draft={gemma_path}", "hi", env=host)
        err = r.stderr.decode().strip()
        assert r.returncode == 2 and len(err.splitlines()) <= 2 and "does not share the vocabulary" in err, err
        rel = run_cli("run", "smol", "--verbose", "-o", "draft=./cut.gguf", "-o", "num_predict=8", "-o",
                      "temperature=0", "Say hello.", env=host, cwd=work)
        assert rel.returncode == 0, rel.stderr.decode()
        ps = httpx.get(url + "/api/ps", timeout=30).json()["models"]
        assert [(m["name"], m["draft"]) for m in ps] == [("smol:latest", "<path>")]  # ./cut.gguf was found


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_ollapy_run_drafts_prints_the_draft_line_and_the_same_text(request, which, tmp_path):
    path = request.getfixturevalue(f"{which}_path")
    prompt = LOG if which == "gemma" else COPY
    base = ["run", str(path), "--verbose", "--no-cache", "-o", "temperature=0", "-o", "num_predict=64"]
    plain = run_cli(*base, prompt)
    drafted = run_cli(*base, "-o", "draft=ngram", prompt)
    assert plain.returncode == 0 == drafted.returncode, drafted.stderr.decode()
    assert drafted.stdout == plain.stdout and drafted.stdout.strip()
    line = [ln for ln in drafted.stderr.decode().splitlines() if ln.startswith("draft:")]
    assert len(line) == 1 and " accepted (" in line[0]
    assert not [ln for ln in plain.stderr.decode().splitlines() if ln.startswith("draft:")]


def test_serve_four_concurrent_clients_draft_and_answer_as_plain(tmp_path, gemma_path):
    """Through `ollapy serve` (num_parallel 4): four clients at once, drafting or not, get the same text; the
    server counts drafted and accepted tokens in /metrics and /api/ps."""
    import concurrent.futures

    import httpx
    from conftest import live_server

    prompts = [LOG, LOG.replace("north", "south"), LOG.replace("keeper", "warden"), LOG.replace("wind", "gust")]

    def ask(url: str, prompt: str, **opts) -> dict:
        body = {"model": str(gemma_path), "prompt": prompt, "raw": True, "stream": False,
                "options": {"temperature": 0, "num_predict": 48, **opts}}
        r = httpx.post(url + "/api/generate", json=body, timeout=900)
        assert r.status_code == 200, r.text
        return r.json()

    # the draft policy's row cost pinned (as CHEAP_ROWS): it drafts whatever the machine's load
    env = {"OLLAPY_NUM_PARALLEL": "4", "OLLAPY_CACHE": "0", "OLLAPY_DRAFT_ROW_COST": "0.05"}
    with live_server(tmp_path, "--allow-paths", env=env) as url:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            plain = list(pool.map(lambda p: ask(url, p), prompts))
            drafted = list(pool.map(lambda p: ask(url, p, draft="ngram"), prompts))
        want = {"drafted": float(sum(d["draft_tokens"] for d in drafted)),
                "draft_accepted": float(sum(d["draft_accepted"] for d in drafted))}
        for _ in range(200):  # a request's counters are added when its generation closes, just after the reply
            metrics = httpx.get(url + "/metrics", timeout=30).text
            counted = {k: float(v) for k, v in re.findall(
                r'^ollapy_tokens_total\{kind="(drafted|draft_accepted)",[^}]*\} (\S+)$', metrics, re.M)}
            if counted == want:
                break
            time.sleep(0.05)
        ps = httpx.get(url + "/api/ps", timeout=30).json()["models"][0]
    assert [d["response"] for d in drafted] == [p["response"] for p in plain]
    assert all(d["draft"] == "ngram" and d["draft_tokens"] > 0 for d in drafted)
    assert all("draft" not in p for p in plain)
    proposed = sum(d["draft_tokens"] for d in drafted)
    accepted = sum(d["draft_accepted"] for d in drafted)
    assert counted == want == {"drafted": proposed, "draft_accepted": accepted}, counted
    assert ps["draft_tokens"] == proposed and ps["draft_accepted"] == accepted


def test_the_repl_drafts_after_set_parameter_and_answers_the_same(smollm2_path):
    import re
    import sys

    import pexpect
    from conftest import ROOT

    env = dict(os.environ, OLLAPY_NOHISTORY="1")
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", str(smollm2_path), "--verbose", "-o",
                                       "temperature=0", "-o", "num_predict=40"],
                      env=env, encoding="utf-8", timeout=300, cwd=str(ROOT), dimensions=(40, 200))
    c.expect_exact(">>> ")

    def ask() -> str:
        c.sendline(COPY)
        c.expect("total duration")
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|[\u2800-\u28ff]|\r", "", c.before)
        return text.split(COPY, 1)[-1].strip()

    plain = ask()
    c.expect_exact(">>> ")
    c.sendline("/clear")
    c.expect_exact(">>> ")
    c.sendline("/set parameter draft ngram")
    c.expect_exact("Set parameter 'draft' to 'ngram'")
    c.expect_exact(">>> ")
    drafted = ask()
    c.expect(r"draft: +(\d+) proposed, (\d+) accepted")
    assert int(c.match.group(1)) > 0
    c.expect_exact(">>> ")
    c.sendline("/show parameters")  # the session's /set values are listed with the model's
    c.expect(r'draft +"ngram"')
    c.expect_exact(">>> ")
    c.sendline("/set parameter draft_min 30")  # above n-gram drafting's cap: refused, and nothing is kept
    c.expect_exact("Error: draft_min (30) is above draft_num_predict (16)")
    c.expect_exact(">>> ")
    c.sendline("/show parameters")
    c.expect_exact(">>> ")
    assert "draft_min" not in c.before and re.search(r'draft +"ngram"', c.before)
    c.sendline("/set parameter draft_num_predict 8")
    c.expect_exact("Set parameter 'draft_num_predict' to '8'")
    c.expect_exact(">>> ")
    c.sendline("/show parameters")  # one column of values, also past a 16-character name
    c.expect_exact(">>> ")
    rows = [ln for ln in c.before.replace("\r", "").splitlines()[1:] if ln.strip()]
    assert 'draft_num_predict  8' in rows and len({len(ln) - len(ln.split(None, 1)[1]) for ln in rows}) == 1, rows
    c.sendline("/clear")
    c.expect_exact(">>> ")
    assert ask() == plain  # the chat goes on drafting as before
    c.expect(r"draft: +(\d+) proposed")
    assert int(c.match.group(1)) > 0
    c.expect_exact(">>> ")
    c.sendline("/bye")
    c.expect(pexpect.EOF)
    assert plain and drafted == plain


def test_the_chat_refuses_a_draft_of_another_vocabulary_without_reloading(smollm2_path, gemma_path):
    """Found by a fresh-user trial: in a chat running the model in this process, ``/set parameter draft`` with a
    draft of another vocabulary was refused, but only after the model had been closed, so the next answer loaded
    it again (~0.2 s) and lost its slot. The GGUF headers are checked before anything closes: the next answer
    loads nothing and reuses the slot's prefix."""
    import sys

    import pexpect
    from conftest import ROOT

    env = dict(os.environ, OLLAPY_NOHISTORY="1")
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", str(smollm2_path), "--verbose", "--local",
                                       "-o", "temperature=0", "-o", "num_predict=8"],
                      env=env, encoding="utf-8", timeout=300, cwd=str(ROOT), dimensions=(40, 200))
    c.expect_exact(">>> ")
    c.sendline("Say hi.")
    c.expect(r"load duration: +(\S+)")
    c.expect_exact(">>> ")
    c.sendline(f"/set parameter draft {gemma_path}")
    c.expect_exact("does not share the vocabulary")
    c.expect_exact(">>> ")
    c.sendline("Say hi again.")
    c.expect(r"load duration: +(\S+)")
    after = c.match.group(1)
    c.expect(r"prompt cache: +(\d+) token\(s\) reused([^\r\n]*)")
    assert (after, c.match.group(2).strip()) == ("0.000µs", "(slot)"), (after, c.match.group(0))
    c.expect_exact(">>> ")
    c.sendline("/bye")
    c.expect(pexpect.EOF)


def test_a_draft_model_after_a_prompt_cache_restore_in_a_new_process(smollm2_path):
    """Second `ollapy run` restores the prompt from the disk cache; the draft model (here the model itself, the
    plumbing case) catches up from the restored tokens and the answer is the cold run's and --no-cache's."""
    import re

    system = " ".join(f"Rule {i}: the courier with badge {i * 7 % 31} walks to street {i * 13 % 97}." for i in range(40))
    base = ["run", str(smollm2_path), "--verbose", "--system", system, "-o", "temperature=0", "-o", "num_predict=32",
            "-o", f"draft={smollm2_path}"]
    q = "Which street does the courier with badge 14 walk to?"
    # the policy's row cost pinned: the cold run's measured steps (remembered for the next process) would say,
    # rightly, that a draft model as big as the target does not pay, and the warm run would not draft at all
    env = {"OLLAPY_DRAFT_ROW_COST": "0.05"}
    cold, warm, nocache = (run_cli(*base, q, env=env), run_cli(*base, q, env=env),
                           run_cli(*base, "--no-cache", q, env=env))
    for r in (cold, warm, nocache):
        assert r.returncode == 0, r.stderr.decode()
    assert cold.stdout == warm.stdout == nocache.stdout and cold.stdout.strip()
    reused = int(re.search(rb"prompt cache: +(\d+) token", warm.stderr).group(1))
    assert reused > 300
    drafted = re.search(rb"draft: +(\d+) proposed, (\d+) accepted", warm.stderr)
    assert drafted and int(drafted.group(2)) > 0
