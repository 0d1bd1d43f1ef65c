"""The prompt cache through `ollapy serve`: metrics and /api/ps figures, and a shutdown and restart that keeps it."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from conftest import post_chat
from rpc_helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = " ".join(f"Guideline {i}: answer briefly, kindly and truthfully." for i in range(30))



def _start(env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve"], env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, cwd=str(ROOT))
    url = f"http://{env['OLLAPY_HOST']}"
    for _ in range(300):  # bounded wait for the port (not an assertion on time)
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start:\n" + log.read_text())


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _chat(url: str, question: str) -> dict:
    return post_chat(url, SYSTEM, question, num_predict=4)


def _metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:_total)?\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    raise AssertionError(f"no {name}{{{want}}} in /metrics:\n{text}")


def test_server_restart_keeps_the_prompt_cache_and_reports_it(smollm2_path, tmp_path):
    import ollama

    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    cache_dir = tmp_path / "cache"
    env.update(OLLAPY_HOST=f"127.0.0.1:{free_port()}", OLLAPY_MODELS=str(tmp_path / "models"),
               OLLAPY_CACHE_DIR=str(cache_dir), OLLAPY_NUM_PARALLEL="2", OLLAPY_CONTEXT_LENGTH="1024",
               XDG_STATE_HOME=str(tmp_path / "state"))
    log = tmp_path / "serve.log"
    proc, url = _start(env, log)
    try:
        oc = ollama.Client(host=url)
        digest = oc.create_blob(smollm2_path)
        oc.create(model="smol:latest", files={"smol.gguf": digest})
        first = _chat(url, "What is 2 plus 2?")
        assert first["prompt_cache_tokens"] == 0
        text = httpx.get(url + "/metrics").text
        assert _metric(text, "ollapy_prompt_cache_misses", model="smol:latest") == 1
        assert _metric(text, "ollapy_prompt_cache_hits", model="smol:latest", tier="ram") == 0
        assert _metric(text, "ollapy_prompt_cache_hits", model="smol:latest", tier="disk") == 0
        assert _metric(text, "ollapy_prompt_cache_written_files", model="smol:latest") == 1  # the system prompt's end
        assert _metric(text, "ollapy_prompt_cache_written_bytes", model="smol:latest") > 1_000_000
        assert _metric(text, "ollapy_prompt_cache_bytes", model="smol:latest", tier="ram") > 1_000_000
        assert _metric(text, "ollapy_prompt_cache_tokens_reused", model="smol:latest") == 0
        assert _metric(text, "ollapy_prompt_cache_restore_buffer_bytes", model="smol:latest") == 0  # nothing restored
        assert _metric(text, "ollapy_prompt_cache_queued_bytes", model="smol:latest") >= 0
        ps = httpx.get(url + "/api/ps").json()["models"]
        assert ps[0]["prompt_cache"]["files_written"] == 1 and ps[0]["prompt_cache"]["misses"] == 1
    finally:
        code = _stop(proc)
    assert code == 0 and "ollapy serve stopped" in log.read_text(), log.read_text()
    assert not [p for p in cache_dir.rglob(".tmp*")]
    assert "not saved" not in log.read_text()
    proc, url = _start(env, log)
    try:
        second = _chat(url, "What is 3 plus 3?")
        # the system prompt (~360 tokens) came from disk; only the new question and the template's tail are prefilled
        assert second["prompt_cache_tokens"] >= second["prompt_eval_count"] - 30
        text = httpx.get(url + "/metrics").text
        assert _metric(text, "ollapy_prompt_cache_hits", model="smol:latest", tier="disk") == 1
        assert _metric(text, "ollapy_prompt_cache_tokens_reused", model="smol:latest") == second["prompt_cache_tokens"]
    finally:
        assert _stop(proc) == 0
