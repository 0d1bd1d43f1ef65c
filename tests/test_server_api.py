"""A live ``ollapy serve`` (subprocess, loopback, OLLAPY_NUM_PARALLEL=4) driven by the official clients.

Covers the Ollama API through the ``ollama`` package, the OpenAI API through
the ``openai`` package, error statuses, CORS, body limits, the CLI's server
path, 64 concurrent streaming chats (no cross-talk, no leaked slot, responsive
server) and a disconnect storm (every slot freed).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from conftest import ROOT, run_cli
from fake_registry import FakeRegistry
from rpc_helpers import free_port

Q = "What is the capital of France? Answer in one word."
GREEDY = {"temperature": 0, "num_predict": 24, "repeat_penalty": 1.0}  # prompt tokens enter the penalty window



@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    base = tmp_path_factory.mktemp("serve")
    port = free_port()
    reg = FakeRegistry()
    reg.__enter__()
    reg.add_model("library", "smolpull", "latest", Path(smollm2_path))
    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    env.update(OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_MODELS=str(base / "models"),
               OLLAPY_CACHE_DIR=str(base / "cache"), OLLAPY_NUM_PARALLEL="4", OLLAPY_CONTEXT_LENGTH="1024",
               OLLAPY_REGISTRY=reg.url, OLLAPY_KEEP_ALIVE="10m", OLLAPY_MAX_BODY="1MiB",
               XDG_STATE_HOME=str(base / "state"))
    log = open(base / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve"], env=env, stdout=log, stderr=log,
                            cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("server did not start:\n" + (base / "serve.log").read_text())
        time.sleep(0.2)
    import ollama

    boot = ollama.Client(host=url)  # as a remote client: upload the GGUF (a server path needs serve --allow-paths)
    boot.create(model="smol", files={"model.gguf": boot.create_blob(smollm2_path)})
    yield SimpleNamespace(url=url, env=env, port=port, base=base, registry=reg, log=base / "serve.log")
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    reg.__exit__(None, None, None)
    log.close()


@pytest.fixture
def oc(server):
    import ollama

    return ollama.Client(host=server.url)


def _ps(server) -> list[dict]:
    return httpx.get(server.url + "/api/ps", timeout=10).json()["models"]


def _wait_idle(server, timeout: float = 20) -> list[dict]:
    deadline = time.time() + timeout
    while True:
        models = _ps(server)
        if all(m["slots_busy"] == 0 and m["queue_depth"] == 0 and m["active_requests"] == 0 for m in models):
            return models
        if time.time() > deadline:
            raise AssertionError(f"slots still busy: {models}")
        time.sleep(0.1)


# ---- basics -----------------------------------------------------------------------------------------
def test_root_head_version(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and "is running" in r.text
    assert httpx.head(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/api/version").json()["version"]


def test_generate_and_chat_with_ollama_client(oc):
    r = oc.generate(model="smol", prompt=Q, options=GREEDY)
    assert r.response == "The capital of France is Paris."
    assert r.done and r.done_reason == "stop" and r.eval_count > 0 and r.prompt_eval_count > 0
    assert r.total_duration >= r.eval_duration > 0
    parts = list(oc.generate(model="smol", prompt=Q, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == "The capital of France is Paris."
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    msgs = [{"role": "user", "content": Q}]
    c = oc.chat(model="smol", messages=msgs, options=GREEDY)
    assert c.message.role == "assistant" and c.message.content == "The capital of France is Paris."
    chunks = list(oc.chat(model="smol", messages=msgs, options=GREEDY, stream=True))
    assert "".join(x.message.content for x in chunks) == c.message.content
    assert chunks[-1].done_reason == "stop"
    raw = httpx.post(oc._client.base_url.join("/api/chat"), json={"model": "smol", "messages": msgs, "stream": False,
                                                                  "options": GREEDY}).json()
    assert "prompt_cache_tokens" in raw and raw["truncated"] is False
    assert raw["prompt_cache_tokens"] > 0  # the same prompt again reuses the slot's KV


def test_generate_options_format_raw_and_length(oc):
    r = oc.generate(model="smol", prompt="Give a JSON object with a key name.", format="json",
                    options={"temperature": 0, "num_predict": 40})
    json.loads(r.response) if r.done_reason == "stop" else None
    assert r.response.lstrip().startswith("{")
    r = oc.generate(model="smol", prompt="Count: 1, 2, 3,", raw=True, options={"temperature": 0, "num_predict": 3})
    assert r.done_reason == "length" and r.eval_count == 3
    r = oc.generate(model="smol", prompt=Q, system="Answer in French.", options=GREEDY)
    assert r.response


def test_list_show_ps_copy_delete(oc, server):
    names = [m.model for m in oc.list().models]
    assert "smol:latest" in names
    s = oc.show("smol")
    assert s.details.family == "llama" and s.details.format == "gguf"
    assert "FROM" in s.modelfile and "<|im_start|>" in s.template  # the template generation uses
    oc.generate(model="smol", prompt="hi", options={"num_predict": 1})
    ps = oc.ps().models
    assert any(m.model == "smol:latest" and m.context_length == 1024 for m in ps)
    oc.copy("smol", "smol-copy:v1")
    assert "smol-copy:v1" in [m.model for m in oc.list().models]
    oc.delete("smol-copy:v1")
    assert "smol-copy:v1" not in [m.model for m in oc.list().models]
    import ollama

    with pytest.raises(ollama.ResponseError) as ei:
        oc.delete("smol-copy:v1")
    assert ei.value.status_code == 404


def test_generate_context_continues_the_earlier_call(oc, server):
    opts = {"temperature": 0, "num_predict": 8}
    first = oc.generate(model="smol", prompt="My name is Ada. Say hello.", options=opts)
    ctx = list(first.context)
    assert len(ctx) == first.prompt_eval_count + first.eval_count, (len(ctx), first)  # every token, the last too
    alone = oc.generate(model="smol", prompt="What is my name?", options=opts)
    second = oc.generate(model="smol", prompt="What is my name?", context=ctx, options=opts)  # the client sends it
    assert list(second.context)[:len(ctx)] == ctx  # the earlier prompt + answer, then the new prompt
    assert second.prompt_eval_count == len(ctx) + alone.prompt_eval_count  # SmolLM2 adds no BOS to drop
    assert len(second.context) > len(ctx) + alone.prompt_eval_count
    u = server.url + "/api/generate"
    for bad in ([-1], [10 ** 9], ["a"], [1.5], [True], "1 2 3", {"a": 1}):
        r = httpx.post(u, json={"model": "smol", "prompt": "hi", "context": bad, "stream": False}, timeout=120)
        assert r.status_code == 400 and set(r.json()) == {"error"} and "context" in r.json()["error"], (bad, r.text)


def test_one_model_id_in_list_ps_tags_and_api_ps(oc, server):
    oc.generate(model="smol", prompt="hi", options={"num_predict": 1})
    tags = httpx.get(server.url + "/api/tags").json()["models"]
    digest = next(m["digest"] for m in tags if m["name"] == "smol:latest")
    assert len(digest) == 64
    api_ps = httpx.get(server.url + "/api/ps").json()["models"]
    assert next(m["digest"] for m in api_ps if m["name"] == "smol:latest") == digest
    for cmd in ("list", "ps"):
        out = run_cli(cmd, env=server.env)
        assert out.returncode == 0, out.stderr
        row = next(line.split() for line in out.stdout.decode().splitlines() if line.startswith("smol:latest "))
        assert row[1] == digest[:12], (cmd, row)
    import datetime

    times = [datetime.datetime.fromisoformat(m["modified_at"].replace("Z", "+00:00")) for m in tags]
    assert times == sorted(times, reverse=True)  # newest first, as Ollama


def test_create_from_uploaded_blob_and_from_model(oc, smollm2_path):
    digest = oc.create_blob(smollm2_path)
    progress = list(oc.create(model="smol-blob", files={"model.gguf": digest}, system="You are terse.",
                              parameters={"temperature": 0}, stream=True))
    assert progress[-1].status == "success"
    s = oc.show("smol-blob")
    assert "You are terse." in s.modelfile and "temperature" in (s.parameters or "")
    oc.create(model="smol-sys", from_="smol", system="Reply in French.")
    assert "Reply in French." in oc.show("smol-sys").modelfile
    oc.delete("smol-blob")
    oc.delete("smol-sys")


def test_pull_with_progress_from_fake_registry(oc):
    statuses = list(oc.pull("smolpull", stream=True))
    texts = [s.status for s in statuses]
    assert texts[0] == "pulling manifest" and texts[-1] == "success"
    blob = [s for s in statuses if s.total]
    assert blob and blob[-1].completed == blob[-1].total
    assert "smolpull:latest" in [m.model for m in oc.list().models]
    assert oc.generate(model="smolpull", prompt=Q, options=GREEDY).response == "The capital of France is Paris."
    oc.generate(model="smolpull", prompt="", keep_alive=0)


# ---- options as Ollama reads them -------------------------------------------------------------------------
# every option the official client's Options type carries that ollapy has no use for, and older Ollama names
COMPAT = {"numa": False, "main_gpu": 0, "low_vram": False, "f16_kv": True, "logits_all": False, "vocab_only": False,
          "use_mmap": True, "use_mlock": False, "embedding_only": False, "num_gqa": 8, "tfs_z": 1.0,
          "penalize_newline": True, "rope_frequency_base": 10000.0, "rope_frequency_scale": 1.0}


def test_options_lenient_as_ollama(oc, server):
    """Unknown names are logged and skipped, nulls skipped, compatibility names accepted; a wrong type is a 400."""
    import ollama

    from ollapy.options import Options

    sent = {**COMPAT, "mirostat": 0, "mirostat_eta": 0.1, "mirostat_tau": 5.0, **GREEDY}
    assert set(ollama.Options.model_fields) - set(Options.names()) <= set(sent)
    assert oc.generate(model="smol", prompt=Q, options=sent).response == "The capital of France is Paris."
    msgs = [{"role": "user", "content": Q}]
    assert oc.chat(model="smol", messages=msgs, options=sent).message.content == "The capital of France is Paris."
    r = oc.chat(model="smol", messages=msgs, options={**GREEDY, "bogus_option_x7": 1})
    assert r.message.content == "The capital of France is Paris."
    warned = [line for line in server.log.read_text().splitlines() if "bogus_option_x7" in line]
    assert len(warned) == 1 and " WARNING " in warned[0]
    # null is "not given": the same text as a request without the key (default temperature, fixed seed)
    base = {"model": "smol", "prompt": "Name a colour.", "stream": False}
    # twice: the second request, like the null one after it, reuses its slot's prefix (a full prefill and a
    # one-token tail give slightly different logits, which sampling at temperature 0.8 can tell apart)
    for _ in range(2):
        plain = httpx.post(server.url + "/api/generate", json={**base, "options": {"seed": 7, "num_predict": 8}},
                           timeout=60)
    null = httpx.post(server.url + "/api/generate", json={**base, "options": {"seed": 7, "num_predict": 8,
                                                                              "temperature": None, "stop": None}},
                      timeout=60)
    assert plain.status_code == null.status_code == 200
    assert null.json()["response"] == plain.json()["response"]
    for route, body in (("/api/generate", {"prompt": Q}), ("/api/chat", {"messages": msgs})):
        for bad in ({"temperature": "hot"}, {"use_mmap": "maybe"}, {"mirostat": 3}, {"stop": 5}):
            r = httpx.post(server.url + route, json={"model": "smol", **body, "options": bad}, timeout=60)
            assert r.status_code == 400, (route, bad, r.text)
            assert next(iter(bad)) in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as ei:
        oc.generate(model="smol", prompt=Q, options={"temperature": "hot"})
    assert ei.value.status_code == 400


def test_mirostat_samples_reproducibly_and_differently(oc):
    """mirostat 1/2 replace top_k/top_p with llama.cpp's Mirostat samplers: a fixed seed repeats the text, and the
    text differs from the default chain's with the same seed."""
    prompt = "Write a short poem about the sea."

    def text(**o) -> str:
        return oc.generate(model="smol", prompt=prompt, options={"seed": 42, "num_predict": 32, **o}).response

    default, v2, v1 = text(mirostat=0), text(mirostat=2), text(mirostat=1, mirostat_tau=3.0, mirostat_eta=0.2)
    assert text(mirostat=2) == v2 and text(mirostat=1, mirostat_tau=3.0, mirostat_eta=0.2) == v1
    assert text(mirostat=0) == default
    assert v2 != default and v1 != default and v1 != v2


# ---- errors, safety -----------------------------------------------------------------------------------
def test_error_statuses(server):
    u = server.url
    r = httpx.post(u + "/api/generate", json={"model": "nosuch", "prompt": "hi"})
    assert r.status_code == 404 and "not found" in r.json()["error"]
    r = httpx.post(u + "/api/chat", json={"model": "smol", "messages": [{"role": "user", "content": "x"}],
                                          "options": {"temperature": "hot"}})
    assert r.status_code == 400 and "temperature" in r.json()["error"]
    r = httpx.post(u + "/api/show", json={"model": "../../etc/passwd"})
    assert r.status_code == 400 and "invalid model name" in r.json()["error"]
    r = httpx.post(u + "/api/generate", content=b"{not json")
    assert r.status_code == 400
    r = httpx.post(u + "/api/generate", json={"model": "smol", "prompt": "x" * (2 << 20)})
    assert r.status_code == 413
    r = httpx.post(u + "/v1/chat/completions", json={"model": "nosuch", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_cors_local_origins_only(server):
    ok = httpx.options(server.url + "/api/chat", headers={"Origin": "http://localhost:3000",
                                                         "Access-Control-Request-Method": "POST"})
    assert ok.headers.get("access-control-allow-origin") == "http://localhost:3000"
    bad = httpx.options(server.url + "/api/chat", headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in bad.headers


def test_metrics_endpoint(server, oc):
    oc.generate(model="smol", prompt="hi", options={"num_predict": 2})
    text = httpx.get(server.url + "/metrics").text
    for name in ("ollapy_requests_total", "ollapy_tokens_total", "ollapy_time_to_first_token_seconds_bucket",
                 "ollapy_slots_busy", "ollapy_queue_depth"):
        assert name in text


# ---- OpenAI ---------------------------------------------------------------------------------------------
def test_openai_client(server):
    import openai

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": Q}]
    flat = {"options": {"repeat_penalty": 1.0}}  # ollapy's extension: Ollama options (the answer pinned here has none)
    r = c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24, seed=1, extra_body=flat)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 0
    chunks = list(c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, extra_body=flat))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "The capital of France is Paris."
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    r = c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=3, top_p=0.9,
                                  presence_penalty=0.1, frequency_penalty=0.1, stop=["\n"])
    assert r.choices[0].finish_reason == "length"
    r = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": "A JSON object with key a."}],
                                  temperature=0, max_tokens=30, response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=40,
                                  response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    if r.choices[0].finish_reason == "stop":
        assert "city" in json.loads(r.choices[0].message.content)
    comp = c.completions.create(model="smol", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert comp.choices[0].text and comp.usage.completion_tokens <= 4
    scomp = list(c.completions.create(model="smol", prompt="The capital of France is", max_tokens=4, temperature=0,
                                      stream=True))
    assert "".join(x.choices[0].text for x in scomp if x.choices) == comp.choices[0].text
    ids = [m.id for m in c.models.list().data]
    assert "smol:latest" in ids
    # OpenAI's developer role is the system message: the same prompt and text as with role system
    instr, ask = "Answer in French.", {"role": "user", "content": Q}
    dev = c.chat.completions.create(model="smol", messages=[{"role": "developer", "content": instr}, ask],
                                    temperature=0, max_tokens=24)
    sys_ = c.chat.completions.create(model="smol", messages=[{"role": "system", "content": instr}, ask],
                                     temperature=0, max_tokens=24)
    assert dev.usage.prompt_tokens == sys_.usage.prompt_tokens
    assert dev.choices[0].message.content == sys_.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nosuch", messages=msgs)


# ---- CLI through the server ------------------------------------------------------------------------------
def test_cli_run_through_server_matches_in_process(server, smollm2_path):
    greedy = ("-o", "temperature=0", "-o", "repeat_penalty=1")
    local = run_cli("run", str(smollm2_path), *greedy, Q, env={"OLLAPY_HOST": "127.0.0.1:9"})
    remote = run_cli("run", "smol", *greedy, Q, env={"OLLAPY_HOST": f"127.0.0.1:{server.port}"})
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout == b"The capital of France is Paris.\n"
    piped = run_cli("run", "smol", *greedy, input=Q, env={"OLLAPY_HOST": f"127.0.0.1:{server.port}"})
    assert piped.stdout == local.stdout, piped.stderr
    bad = run_cli("run", "nosuch", "hi", env={"OLLAPY_HOST": f"127.0.0.1:{server.port}"})
    assert bad.returncode == 1 and b"not found" in bad.stderr and b"Traceback" not in bad.stderr
    ps = run_cli("ps", env={"OLLAPY_HOST": f"127.0.0.1:{server.port}"})
    header = [b"NAME", b"ID", b"SIZE", b"PROCESSOR", b"CONTEXT", b"SLOTS", b"KV/SLOT", b"DRAFT", b"UNTIL"]
    assert ps.returncode == 0 and ps.stdout.split()[:9] == header
    assert b" f16" in ps.stdout  # KV bytes per slot and the KV type of the loaded model
    none = run_cli("ps", env={"OLLAPY_HOST": "127.0.0.1:9"})
    assert none.returncode == 1 and b"no ollapy server is running" in none.stderr


def test_cli_run_pulls_a_missing_model_through_the_server(server, gemma_path):
    """`run` of a model the server lacks: with --no-pull the server's one-line 404; without it the server pulls it
    (its /api/pull, progress on stderr as a pull here shows it), then answers; the client's store stays empty."""
    from fake_registry import sha256_path

    server.registry.add_model("library", "gemmarun", "270m", Path(gemma_path))
    env = {"OLLAPY_HOST": f"127.0.0.1:{server.port}"}
    greedy = ("-o", "temperature=0", "-o", "num_predict=8")
    refused = run_cli("run", "gemmarun:270m", "--no-pull", *greedy, "hi", env=env)
    assert refused.returncode == 1 and refused.stderr.decode().splitlines() == [
        "Error: model 'gemmarun:270m' not found (try `ollapy pull gemmarun:270m`)"], refused.stderr
    r = run_cli("run", "gemmarun:270m", *greedy, "The capital of France is", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    err = r.stderr.decode().splitlines()
    digest = "sha256:" + sha256_path(Path(gemma_path))[:12]
    assert err[0] == "pulling manifest", err
    assert f"pulling manifest of gemmarun:270m from {server.registry.url}" in err, err
    assert f"pulling {digest} (253 MB)" in err, err  # PlainProgress's lines, as a pull in this process prints them
    assert any(x.startswith(f"done {digest} 253 MB in ") for x in err), err
    assert "success" not in err and len(err) == len(set(err)), err
    tags = httpx.get(server.url + "/api/tags").json()["models"]
    assert "gemmarun:270m" in [m["name"] for m in tags]
    assert not list(Path(os.environ["OLLAPY_MODELS"]).rglob("*gemmarun*"))  # pulled by the server, not here
    missing = run_cli("run", "nosuchrun", "hi", env=env)
    assert missing.returncode == 1 and missing.stderr.decode().splitlines()[-1] == (
        "Error: model 'nosuchrun:latest' not found in any source"), missing.stderr  # no "try `ollapy pull`": that pull failed
    httpx.post(server.url + "/api/generate", json={"model": "gemmarun:270m", "keep_alive": 0}, timeout=60)
    httpx.request("DELETE", server.url + "/api/delete", json={"model": "gemmarun:270m"}, timeout=60)


def test_cli_embed_pulls_a_missing_model_through_the_server(server, smollm2_path):
    """`embed` of a model the server lacks, as `run`: --no-pull gives the server's one-line 404; without it the
    server pulls the model, then the vectors print; the client's store stays empty."""
    server.registry.add_model("library", "embedpull", "135m", Path(smollm2_path))
    env = {"OLLAPY_HOST": f"127.0.0.1:{server.port}"}
    refused = run_cli("embed", "embedpull:135m", "--no-pull", "a cat", env=env)
    assert refused.returncode == 1 and refused.stderr.decode().splitlines() == [
        "Error: model 'embedpull:135m' not found (try `ollapy pull embedpull:135m`)"], refused.stderr
    r = run_cli("embed", "embedpull:135m", "a cat", "--dimensions", "8", env=env)
    assert r.returncode == 0, r.stderr
    vec = json.loads(r.stdout.decode())
    assert len(vec) == 8 and all(isinstance(x, float) for x in vec)
    assert "pulling manifest" in r.stderr.decode().splitlines(), r.stderr
    assert not list(Path(os.environ["OLLAPY_MODELS"]).rglob("*embedpull*"))  # pulled by the server, not here
    httpx.post(server.url + "/api/generate", json={"model": "embedpull:135m", "keep_alive": 0}, timeout=60)
    httpx.request("DELETE", server.url + "/api/delete", json={"model": "embedpull:135m"}, timeout=60)


# ---- load ---------------------------------------------------------------------------------------------------
WORDS = ["zebra", "mango", "violet", "copper", "falcon", "tulip", "walnut", "orchid", "raven", "maple", "saturn",
         "lemon", "tiger", "amber", "banana", "cactus", "dolphin", "eagle", "forest", "garden", "harbor", "island",
         "jungle", "kettle", "ladder", "marble", "needle", "ocean", "pencil", "quartz", "pumpkin", "silver", "tunnel",
         "umbrella", "velvet", "window", "yellow", "anchor", "bottle", "candle", "desert", "engine", "feather",
         "guitar", "hammer", "jacket", "kitten", "glacier", "mirror", "napkin", "orange", "parrot", "rabbit", "salmon",
         "turtle", "valley", "wizard", "button", "cherry", "donkey", "muffin", "pirate", "sunset", "planet"]
assert len(set(WORDS)) == 64


def _code_word_messages(word: str) -> list[dict]:
    return [{"role": "user", "content": "Repeat the code word: APPLE"}, {"role": "assistant", "content": "APPLE"},
            {"role": "user", "content": "Repeat the code word: RIVER"}, {"role": "assistant", "content": "RIVER"},
            {"role": "user", "content": f"Repeat the code word: {word.upper()}"}]


async def _stream_chat(client: httpx.AsyncClient, word: str) -> tuple[str, dict]:
    # no repeat penalty: the code word is in the prompt, and prompt tokens are in the penalty window
    body = {"model": "smol", "messages": _code_word_messages(word),
            "options": {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.0}}
    parts, final = [], None
    async with client.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line:
                continue
            obj = json.loads(line)
            assert "error" not in obj, obj
            parts.append(obj["message"]["content"])
            if obj["done"]:
                final = obj
    assert final is not None
    return "".join(parts), final


def test_64_concurrent_streaming_chats(server):
    async def main():
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=180, limits=limits) as client:
            stop = asyncio.Event()
            version_lat: list[float] = []

            async def poll_version():
                while not stop.is_set():
                    t = time.perf_counter()
                    r = await client.get("/api/version")
                    assert r.status_code == 200
                    version_lat.append(time.perf_counter() - t)
                    await asyncio.sleep(0.1)

            poller = asyncio.create_task(poll_version())
            t0 = time.perf_counter()
            results = await asyncio.gather(*(_stream_chat(client, w) for w in WORDS))
            elapsed = time.perf_counter() - t0
            stop.set()
            await poller
            return results, version_lat, elapsed

    results, version_lat, elapsed = asyncio.run(main())
    assert len(results) == 64
    own = 0
    for word, (text, final) in zip(WORDS, results):
        low = text.lower()
        others = [w for w in WORDS if w != word and w in low]
        assert not others, f"{word}: answer {text!r} contains other code words {others}"
        own += word in low
        assert final["done_reason"] in ("stop", "length")
    # a 135M model repeats nearly every word; crossing answers between requests would break this entirely
    assert own >= 60, [(w, t) for w, (t, _) in zip(WORDS, results) if w not in t.lower()]
    assert len(version_lat) >= 3  # the event loop kept answering while 64 chats streamed
    models = _wait_idle(server, timeout=5)
    assert models and all(m["slots_busy"] == 0 for m in models)
    print(f"64 chats in {elapsed:.1f}s; own word in {own}/64; /api/version max {max(version_lat) * 1000:.0f} ms")


def test_disconnect_storm_frees_every_slot(server):
    rng = random.Random(7)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        cut = rng.choice([0, 0, 1, 2, 5])  # 0 = before the first token (mid-prefill)
        body = {"model": "smol", "messages": [{"role": "user", "content": f"Write a long story about robot {i}."}],
                "options": {"temperature": 0.7, "num_predict": 200}}
        async with client.stream("POST", "/api/chat", json=body) as r:
            if cut == 0:
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                return
            n = 0
            async for _ in r.aiter_lines():
                n += 1
                if n >= cut:
                    return

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=50, max_keepalive_connections=0)) as client:
            await asyncio.gather(*(one(client, i) for i in range(20)))

    asyncio.run(main())
    _wait_idle(server, timeout=20)
    r = httpx.post(server.url + "/api/chat", json={"model": "smol", "messages": [{"role": "user", "content": Q}],
                                                   "stream": False, "options": GREEDY}, timeout=60)
    assert r.json()["message"]["content"] == "The capital of France is Paris."


# ---- keep_alive -------------------------------------------------------------------------------------------
def test_load_and_unload_with_keep_alive(oc, server):
    r = oc.generate(model="smol", prompt="")
    assert r.done and r.done_reason == "load"
    assert any(m.model == "smol:latest" for m in oc.ps().models)
    r = oc.generate(model="smol", prompt="", keep_alive=0)
    assert r.done_reason == "unload"
    deadline = time.time() + 10
    while any(m.model == "smol:latest" for m in oc.ps().models):
        assert time.time() < deadline
        time.sleep(0.1)
    r = oc.chat(model="smol", messages=[{"role": "user", "content": Q}], options=GREEDY, keep_alive=0)
    assert r.message.content == "The capital of France is Paris." and r.load_duration > 0
    deadline = time.time() + 10
    while any(m.model == "smol:latest" for m in oc.ps().models):
        assert time.time() < deadline
        time.sleep(0.1)
