"""OLLAPY_RUNNER=process end to end: the CLI in a new process and a live ``ollapy serve`` whose runner children
are killed with SIGABRT (what ggml's abort does): only that model's requests fail, then it reloads."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
from conftest import ROOT, live_server, run_cli

COUNT = "Count from 1 to 400, separated by commas: 1, 2, 3,"
LONG = ("You are a careful assistant for a small library. Readers ask about opening hours, the rules for borrowing "
        "books, late fees, the reading room, printing, and the children's corner. Answer politely and briefly. "
        "Question: the library opens at nine on weekdays and at ten on Saturdays; when does it open on Saturday?")
PROCESS = {"OLLAPY_RUNNER": "process"}


def _runner_children(*, ppid: int | None = None, host: str | None = None) -> dict[int, str]:
    """Runner children (pid -> model label) of process ``ppid``, or of the server listening at ``host``."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if b"ollapy.runner.child" not in cmd:
                continue
            with open(f"/proc/{d}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if (ppid is not None and parent == ppid) or (host is not None and f"OLLAPY_HOST={host}".encode() in env):
            out[int(d)] = cmd[cmd.index(b"ollapy.runner.child") + 2].decode()
    return out


def _runner_of(host: str, name: str) -> int:
    pids = [pid for pid, label in _runner_children(host=host).items() if label == name]
    assert len(pids) == 1, pids
    return pids[0]


def test_cli_process_runner_same_text_and_a_disk_cache_hit_in_the_next_process(smollm2_path):
    one = ("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=16")
    inproc, isolated = run_cli(*one, LONG, env={"OLLAPY_CACHE": "0"}), run_cli(*one, LONG, env={**PROCESS, "OLLAPY_CACHE": "0"})
    assert inproc.returncode == 0 and isolated.returncode == 0, isolated.stderr
    assert isolated.stdout == inproc.stdout and isolated.stdout.strip()
    batch = (*one, "--each-line", "--json")
    cold = json.loads(run_cli(*batch, input=LONG + "\n", env={"OLLAPY_CACHE": "0"}).stdout)
    first = json.loads(run_cli(*batch, input=LONG + "\n", env=PROCESS).stdout)
    second = json.loads(run_cli(*batch, input=LONG + "\n", env=PROCESS).stdout)
    assert (first["response"], first["eval_count"], first["prompt_eval_count"]) == \
        (cold["response"], cold["eval_count"], cold["prompt_eval_count"])
    assert first["prompt_cache_source"] == "none"
    # the first runner child's cache write was drained when it closed: the next process restores it from disk
    assert second["prompt_cache_source"] == "cache disk" and second["prompt_cache_tokens"] >= 64, second


def _cli(*args: str) -> subprocess.Popen:
    env = dict(os.environ, **PROCESS)
    env.pop("OLLAPY_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=str(ROOT))


def test_cli_runner_killed_mid_answer_exits_1_with_one_stderr_line(smollm2_path):
    proc = _cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=400", COUNT)
    assert proc.stdout.read(1)  # the answer has begun: the child is generating
    (pid,) = _runner_children(ppid=proc.pid)
    os.kill(pid, signal.SIGABRT)
    _, err = proc.communicate(timeout=300)
    lines = [ln for ln in err.decode().splitlines() if ln.strip()]
    assert proc.returncode == 1, err
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "stopped (SIGABRT)" in lines[0], err


def test_cli_ctrl_c_ends_the_runner_child_too(smollm2_path):
    proc = _cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=400", COUNT)
    assert proc.stdout.read(1)
    (pid,) = _runner_children(ppid=proc.pid)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    assert proc.returncode == 130
    assert not os.path.exists(f"/proc/{pid}")  # closed and reaped, not orphaned


def test_bad_model_file_under_process_runner_is_the_same_one_line_error(tmp_path):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, not a model\n")
    for target in (bad, tmp_path / "missing.gguf"):
        inproc, isolated = run_cli("run", str(target), "hi"), run_cli("run", str(target), "hi", env=PROCESS)
        assert isolated.returncode == inproc.returncode == 1
        assert isolated.stderr == inproc.stderr and len(isolated.stderr.decode().strip().splitlines()) == 1


def _generate(url: str, model: str, prompt: str, n: int, **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {"temperature": 0, "num_predict": n}}
    return httpx.post(f"{url}/api/generate", json={**body, **extra}, timeout=300)


def test_server_keeps_serving_when_a_runner_aborts_and_reloads_it(tmp_path, smollm2_path, gemma_path):
    smol, gem = str(smollm2_path), str(gemma_path)
    with live_server(tmp_path, "--allow-paths", env=PROCESS) as url:
        host = url.removeprefix("http://")
        assert _generate(url, gem, "Hi", 4).status_code == 200
        body = {"model": smol, "prompt": COUNT, "raw": True, "options": {"temperature": 0, "num_predict": 400}}
        with httpx.stream("POST", f"{url}/api/generate", json=body, timeout=300) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert not json.loads(next(lines))["done"]
            killed = _runner_of(host, smollm2_path.name)
            os.kill(killed, signal.SIGABRT)
            rest = [json.loads(x) for x in lines if x.strip()]
        assert "stopped (SIGABRT)" in rest[-1]["error"] and not any("error" in x for x in rest[:-1]), rest[-3:]
        assert httpx.get(f"{url}/api/ps").status_code == 200  # the dead runner is still listed: no crash
        assert httpx.get(f"{url}/metrics").status_code == 200
        other = _generate(url, gem, "Name a colour.", 6)
        assert other.status_code == 200 and other.json()["eval_count"] == 6  # the other model kept its runner
        again = _generate(url, smol, "Hello", 6)
        assert again.status_code == 200 and again.json()["eval_count"] == 6
        reloaded = _runner_of(host, smollm2_path.name)
        assert reloaded != killed
        # a non-streamed request whose runner dies before the answer: 502 with Ollama's error body
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(r=_generate(url, smol, COUNT, 400, raw=True)))
        t.start()
        while t.is_alive():
            ps = httpx.get(f"{url}/api/ps").json()["models"]
            if any(m["name"] == smollm2_path.name and m["slots_busy"] == 1 for m in ps):
                break
        os.kill(reloaded, signal.SIGABRT)
        t.join()
        assert result["r"].status_code == 502, result["r"].text
        assert "stopped (SIGABRT)" in result["r"].json()["error"]
        assert _generate(url, smol, "Hello", 6).json()["eval_count"] == 6
