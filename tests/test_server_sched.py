"""A live ``ollapy serve`` with two real models: a stopped runner child stalls only its own model, a reload
of one model leaves the other's stream untouched, and a full wait queue is a 503 with ``Retry-After``; the
runner child never imports modules from the user's working directory."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from conftest import HANG_GUARD_S, live_server, run_cli

HTTP_S = 30  # each request's timeout: generous (a loaded 2-core machine), the point is that nothing hangs
COUNT = "Count from 1 to 400, separated by commas: 1, 2, 3,"
QUESTION = "What is the capital of France? Answer in one word."


def _generate(client: httpx.Client, model: str, prompt: str, n: int, **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {"temperature": 0, "num_predict": n}}
    return client.post("/api/generate", json={**body, **extra})


def _ps_row(client: httpx.Client, name: str) -> dict:
    resp = client.get("/api/ps")
    assert resp.status_code == 200
    return next(m for m in resp.json()["models"] if m["name"] == name)


def _poll(fn, guard_s: float = 120):
    """Call ``fn`` until it returns something true; fails past ``guard_s`` (a hang guard)."""
    end = time.monotonic() + guard_s
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("condition never met")


def test_a_stopped_runner_stalls_nothing_but_its_own_model(tmp_path, smollm2_path, gemma_path):
    """SIGSTOP one model's runner child: the server still answers /api/version, /api/tags, a request to the
    other model and /api/ps (showing the stopped one stale); a request to the stopped model fails with 502
    after OLLAPY_RUNNER_TIMEOUT instead of hanging; after SIGCONT everything resumes."""
    smol, gem = str(smollm2_path), str(gemma_path)
    env = {"OLLAPY_RUNNER": "process", "OLLAPY_RUNNER_TIMEOUT": "5", "OLLAPY_MAX_LOADED_MODELS": "2"}
    with live_server(tmp_path, "--allow-paths", env=env) as url, httpx.Client(base_url=url, timeout=HTTP_S) as c:
        first = _generate(c, smol, QUESTION, 8)
        assert first.status_code == 200, first.text
        pid = _ps_row(c, smollm2_path.name)["runner_pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            assert c.get("/api/version").status_code == 200
            assert c.get("/api/tags").status_code == 200
            other = _generate(c, gem, "The capital of France is", 4, raw=True)
            assert other.status_code == 200 and other.json()["eval_count"] == 4, other.text
            stuck = _generate(c, smol, QUESTION, 8)
            assert stuck.status_code == 502 and "did not answer" in stuck.json()["error"], stuck.text
            row = _poll(lambda: (r := _ps_row(c, smollm2_path.name))["stale"] and r)
            assert row["stats_age_s"] > 5 and row["runner_pid"] == pid
            listing = run_cli("ps", env={"OLLAPY_HOST": url.removeprefix("http://")})
            line = next(ln for ln in listing.stdout.decode().splitlines() if ln.startswith(smollm2_path.name))
            assert listing.returncode == 0 and "0/1 (stale " in line, listing.stdout
            assert _ps_row(c, gemma_path.name)["stale"] is False
            metrics = c.get("/metrics")
            assert metrics.status_code == 200
            assert f'ollapy_runner_stale{{model="{smollm2_path.name}"}} 1.0' in metrics.text
        finally:
            os.kill(pid, signal.SIGCONT)
        again = _generate(c, smol, QUESTION, 8)
        assert again.status_code == 200 and again.json()["response"] == first.json()["response"]
        assert _poll(lambda: not _ps_row(c, smollm2_path.name)["stale"])
        assert _ps_row(c, smollm2_path.name)["runner_pid"] == pid  # the same child, resumed


def test_a_reload_of_one_model_leaves_the_other_models_stream_untouched(tmp_path, smollm2_path, gemma_path):
    """A reload of model A (new num_ctx) in the middle of model B's stream: B's stream goes on to the same
    tokens as a solo run, and A is reloaded meanwhile."""
    smol, gem = str(smollm2_path), str(gemma_path)
    body = {"model": gem, "prompt": COUNT, "raw": True, "options": {"temperature": 0, "num_predict": 48}}
    with live_server(tmp_path, "--allow-paths", env={"OLLAPY_MAX_LOADED_MODELS": "2"}) as url, \
            httpx.Client(base_url=url, timeout=HTTP_S) as c:
        # the baseline is a second run, as the streamed one is (both reuse the first run's KV of the prompt)
        c.post("/api/generate", json={**body, "stream": False}, timeout=HANG_GUARD_S)
        solo = c.post("/api/generate", json={**body, "stream": False}, timeout=HANG_GUARD_S).json()
        assert _generate(c, smol, QUESTION, 4, options={"num_ctx": 512, "temperature": 0, "num_predict": 4}).status_code == 200
        assert _ps_row(c, smollm2_path.name)["context_length"] == 512
        chunks: list[dict] = []
        started = threading.Event()

        def stream_b() -> None:
            with httpx.stream("POST", f"{url}/api/generate", json=body, timeout=HANG_GUARD_S) as resp:
                for line in resp.iter_lines():
                    if line.strip():
                        chunks.append(json.loads(line))
                        started.set()

        t = threading.Thread(target=stream_b, daemon=True)
        t.start()
        assert started.wait(HANG_GUARD_S)
        reload = _generate(c, smol, QUESTION, 4, options={"num_ctx": 1024, "temperature": 0, "num_predict": 4})
        assert reload.status_code == 200 and reload.json()["load_duration"] > 0  # A was loaded again
        t.join(HANG_GUARD_S)
        assert chunks[-1]["done"] and chunks[-1]["eval_count"] == 48 and "error" not in chunks[-1]
        assert "".join(ch["response"] for ch in chunks) == solo["response"]
        assert _ps_row(c, smollm2_path.name)["context_length"] == 1024


def test_a_full_wait_queue_is_a_503_with_retry_after_in_each_callers_format(tmp_path, gemma_path):
    """OLLAPY_MAX_QUEUE=0 and one slot: while a request generates, the next one is refused at once, as
    Ollama's OLLAMA_MAX_QUEUE does: a 503 with Retry-After, in Ollama's and in OpenAI's error shape. (The
    busy request is a base model counting with a budget of 2,000 tokens; leaving the stream cancels it.)"""
    gem = str(gemma_path)
    env = {"OLLAPY_MAX_QUEUE": "0", "OLLAPY_NUM_PARALLEL": "1", "OLLAPY_CONTEXT_LENGTH": "4096"}
    with live_server(tmp_path, "--allow-paths", env=env) as url, httpx.Client(base_url=url, timeout=HTTP_S) as c:
        body = {"model": gem, "prompt": COUNT, "raw": True, "options": {"temperature": 0, "num_predict": 2000}}
        with httpx.stream("POST", f"{url}/api/generate", json=body, timeout=HANG_GUARD_S) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()  # kept: a dropped line iterator closes the stream (the request is cancelled)
            assert not json.loads(next(lines))["done"]
            row = _ps_row(c, gemma_path.name)
            assert (row["num_parallel"], row["slots_busy"]) == (1, 1), row  # the one slot is busy
            ollama = _generate(c, gem, QUESTION, 4)
            openai = c.post("/v1/chat/completions", json={"model": gem, "max_tokens": 4,
                                                          "messages": [{"role": "user", "content": QUESTION}]})
        assert ollama.status_code == 503 and ollama.headers["retry-after"] == "1", ollama.text
        words = "server busy: 0 requests already waiting (retry later or raise OLLAPY_MAX_QUEUE / num_parallel)"
        assert ollama.json() == {"error": words}, ollama.text
        assert openai.status_code == 503 and openai.headers["retry-after"] == "1"
        assert openai.json()["error"] == {"message": words, "type": "server_busy", "param": None, "code": None}


def _ollapy_script() -> str:
    """The installed ``ollapy`` console script (its own directory, not the working directory, starts its
    ``sys.path``, as for a user)."""
    script = Path(sys.executable).parent / "ollapy"
    return str(script) if script.exists() else shutil.which("ollapy") or "ollapy"


def test_the_runner_child_imports_nothing_from_the_working_directory(tmp_path, smollm2_path):
    """A ``queue.py`` and a ``logging.py`` that raise (and leave a mark) in the directory where the user runs
    ``OLLAPY_RUNNER=process ollapy run``: the child never imports them and the answer is the usual one."""
    work = tmp_path / "work"
    work.mkdir()
    for mod in ("queue", "logging"):
        (work / f"{mod}.py").write_text(f"open({str(work / ('imported-' + mod))!r}, 'w').close()\n"
                                        f"raise SystemExit('the planted {mod}.py was imported')\n")
    args = ("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=8", QUESTION)
    clean = run_cli(*args, env={"OLLAPY_RUNNER": "process", "OLLAPY_CACHE": "0"})
    env = dict(os.environ, OLLAPY_RUNNER="process", OLLAPY_CACHE="0")
    env.pop("OLLAPY_DEBUG", None)
    planted = subprocess.run([_ollapy_script(), *args], cwd=work, env=env, capture_output=True, timeout=HANG_GUARD_S)
    assert clean.returncode == 0 and clean.stdout.strip(), clean.stderr
    assert planted.returncode == 0, planted.stderr
    assert planted.stdout == clean.stdout
    assert sorted(p.name for p in work.iterdir()) == ["logging.py", "queue.py"]  # no mark left: never imported


def test_stopping_the_server_mid_stream_ends_the_stream_and_prints_no_traceback(tmp_path, smollm2_path):
    """SIGINT while a stream runs: the generation is cancelled at once, the stream's last line is an error line
    (the client sees a complete answer), and serve exits 0 without a traceback (found by a fresh-user trial)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("OLLAPY_DEBUG", None)
    boot = ("import signal,sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv=['ollapy','serve','--allow-paths']; from ollapy.cli import main; main()")
    proc = subprocess.Popen([sys.executable, "-c", boot], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"model": str(smollm2_path), "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9,", "raw": True, "stream": True,
                "options": {"temperature": 0, "repeat_penalty": 1, "num_predict": 3000}}
        lines = []
        with httpx.stream("POST", url + "/api/generate", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                lines.append(json.loads(line))
                if len(lines) == 3:
                    proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert len(lines) < 1000 and "error" in lines[-1] and not lines[-1].get("done")  # cut short, then ended
    assert b"Traceback" not in err and b"Exception in ASGI application" not in err, err.decode(errors="replace")
