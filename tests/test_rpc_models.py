"""Models split over llama.cpp's RPC backend, through the real entry points, on the real tiny models.

Two `ollapy rpc-server` processes on loopback stand in for two hosts. Every model that uses RPC runs in a
child runner process (ggml's RPC client aborts the process that loses a server), so these tests also cover
that path: a lost server ends only the request (exit 1 and one line; a server keeps serving), and the next
request reloads once the endpoint is back. Assertions are on events and tokens, never on time.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from conftest import HANG_GUARD_S, ROOT, live_server, run_cli
from rpc_helpers import RpcServer, free_port, rpc_servers

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France? Answer in one word."
GREEDY = ["-o", "temperature=0", "-o", "repeat_penalty=1", "-o", "num_predict=24"]


def _run(model, *extra: str, env: dict | None = None):
    return run_cli("run", str(model), *GREEDY, "--verbose", *extra, PROMPT, env=env, timeout=HANG_GUARD_S)


def _reused(stderr: bytes) -> tuple[int, str]:
    m = re.search(rb"^prompt cache: +(\d+) token\(s\) reused(?: \(([a-z ]+)(?:, [^)]*)?\))?", stderr, re.M)
    assert m, stderr.decode(errors="replace")[-1500:]
    return int(m.group(1)), (m.group(2) or b"none").decode()


@pytest.fixture(scope="module")
def two_servers():
    with rpc_servers(2) as servers:
        yield servers


def test_info_reports_rpc_and_lists_each_servers_device_and_memory(two_servers):
    eps = ",".join(s.endpoint for s in two_servers)
    out = run_cli("info", "--json", "--rpc", eps, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr.decode()
    rpc = json.loads(out.stdout)["rpc"]
    assert rpc["supported"] is True  # the README's setup builds llama.cpp with -DGGML_RPC=ON
    assert [s["endpoint"] for s in rpc["servers"]] == [s.endpoint for s in two_servers]
    for srv in rpc["servers"]:
        assert srv["protocol"].startswith("7.")
        (dev,) = srv["devices"]
        assert dev["name"].startswith("RPC") and dev["total"] > 0 and 0 < dev["free"] <= dev["total"]
    text = run_cli("info", env={"OLLAPY_RPC": eps}, timeout=HANG_GUARD_S).stdout.decode()
    assert "rpc:               yes" in text and f"{two_servers[1].endpoint}  RPC" in text


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_split_over_two_servers_gives_the_local_greedy_output(model, two_servers, request):
    path = request.getfixturevalue(model)
    local = _run(path, "--no-cache")
    assert local.returncode == 0, local.stderr.decode()
    eps = ",".join(s.endpoint for s in two_servers)
    remote = _run(path, "--no-cache", "-o", f"rpc={eps}")
    assert remote.returncode == 0, remote.stderr.decode()
    assert remote.stdout == local.stdout and len(local.stdout.strip()) > 0
    # uneven split and only some layers offloaded (the rest stay on this host's CPU): same tokens
    part = _run(path, "--no-cache", "-o", f"rpc={eps}", "-o", "tensor_split=3,1", "-o", "num_gpu=6")
    assert part.returncode == 0, part.stderr.decode()
    assert part.stdout == local.stdout


def test_unreachable_endpoint_is_one_line_and_exit_1_without_a_core_dump(smollm2_path, tmp_path):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "ollapy.cli.main", "run", str(smollm2_path), "-o",
                          f"rpc=127.0.0.1:{port}", PROMPT], capture_output=True, cwd=str(tmp_path),
                         timeout=HANG_GUARD_S, env=_env())
    assert out.returncode == 1
    lines = out.stderr.decode().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "refused" in lines[0], lines
    assert out.stdout == b"" and list(tmp_path.iterdir()) == []  # no core file


def _env(**extra: str) -> dict:
    import os

    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    env.update(extra)
    return env


def test_cache_entries_restore_across_layouts(smollm2_path, tmp_path, two_servers):
    """A state saved by a local run never restores under the RPC layout, nor the other way round, whatever the KV
    settings: the devices that computed its cells are part of the cache salt (issue 53: remote hosts' kernels
    round differently, so a restored state is not what a cold prefill there computes). A miss, never a wrong
    restore; the greedy output is the same either way. The same layout twice restores (cache disk)."""
    system = " ".join(f"Rule {i}: answer politely in one short sentence." for i in range(1, 40))
    eps = ",".join(s.endpoint for s in two_servers)
    for fa in ("off",):
        for first, second, expect in ((None, eps, "none"), (eps, None, "none"), (eps, eps, "cache disk")):
            name = f"{fa}-{'local' if first is None else 'rpc'}-then-{'local' if second is None else 'rpc'}"
            env = {"OLLAPY_CACHE_DIR": str(tmp_path / name)}
            args = ("--system", system, "-o", f"flash_attn={fa}")
            one = _run(smollm2_path, *args, *(("-o", f"rpc={first}") if first else ()), env=env)
            assert one.returncode == 0, one.stderr.decode()
            assert _reused(one.stderr) == (0, "none")
            two = _run(smollm2_path, *args, *(("-o", f"rpc={second}") if second else ()), env=env)
            assert two.returncode == 0, two.stderr.decode()
            n, source = _reused(two.stderr)
            assert source == expect, (name, n, source)
            assert n > 300 if expect == "cache disk" else n == 0, (name, n)
            assert two.stdout == one.stdout, name


def test_a_lost_server_fails_only_the_request_and_the_next_one_reloads(smollm2_path, gemma_path, tmp_path):
    """`serve` with one model on two RPC servers and one local model: killing a server mid-generation ends
    that stream with an error, the local model keeps answering, and once the server is back the RPC model
    answers again (reloaded). `run` on a lost server: exit 1 and one line."""
    a, b = RpcServer().start(), RpcServer().start()
    try:
        modelfile = tmp_path / "Modelfile"
        modelfile.write_text(f"FROM {smollm2_path}\nPARAMETER rpc {a.endpoint},{b.endpoint}\n")
        made = run_cli("create", "split", "-f", str(modelfile), env={"OLLAPY_MODELS": str(tmp_path / "models")},
                       timeout=HANG_GUARD_S)
        assert made.returncode == 0, made.stderr.decode()
        with live_server(tmp_path, "--allow-paths") as url:
            body = {"model": "split", "prompt": "Count from one to one hundred, in words.", "stream": True,
                    "options": {"temperature": 0, "num_predict": 400}}
            lines = []
            with httpx.stream("POST", f"{url}/api/generate", json=body, timeout=HANG_GUARD_S) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    lines.append(json.loads(line))
                    if len(lines) == 3:
                        b.kill()  # a host lost mid-generation
            assert "error" in lines[-1] and not lines[-1].get("done"), lines[-1]
            assert "runner" in lines[-1]["error"] and f"RPC server {b.endpoint} does not answer" in lines[-1]["error"]
            local = httpx.post(f"{url}/api/generate", json={"model": str(gemma_path), "prompt": PROMPT,
                                                             "stream": False, "options": {"num_predict": 8}},
                               timeout=HANG_GUARD_S)
            assert local.status_code == 200 and local.json()["done"], local.text
            down = httpx.post(f"{url}/api/generate", json={**body, "stream": False}, timeout=HANG_GUARD_S)
            assert down.status_code == 502 and b.endpoint in down.json()["error"], down.text
            b = RpcServer(port=b.port).start()  # the host is back
            again = httpx.post(f"{url}/api/generate", json={**body, "stream": False, "options": {"num_predict": 8}},
                               timeout=HANG_GUARD_S)
            # reloaded (load_duration) and answering; its text is not this test's subject (the split's greedy text is
            # test_split_over_two_servers_gives_the_local_greedy_output's): once in a full CI run on an AMX Xeon the
            # reloaded split answered "No numbers at all." (5 tokens, then EOS), never in 7 runs of this test alone
            assert again.status_code == 200 and again.json()["done"] and again.json()["load_duration"] > 0, again.text
            ended, n = again.json()["done_reason"], again.json()["eval_count"]
            assert (ended, n) == ("length", 8) if ended == "length" else (ended == "stop" and n > 0), again.text
            ps = {m["name"]: m for m in httpx.get(f"{url}/api/ps", timeout=HANG_GUARD_S).json()["models"]}
            assert ps["split:latest"]["rpc"] == f"{a.endpoint},{b.endpoint}"
            assert isinstance(ps["split:latest"]["runner_pid"], int)
            assert [m["rpc"] for n, m in ps.items() if n != "split:latest"] == [None], ps.keys()  # the local Gemma
            table = run_cli("ps", env={"OLLAPY_HOST": url}, timeout=HANG_GUARD_S).stdout.decode().splitlines()
            assert "PROCESSOR" in table[0] and any(r.startswith("split:latest") and "RPC (2 servers)" in r
                                                   for r in table[1:]), table
        # the CLI: a server lost mid-generation is exit 1 and one line
        proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "run", str(smollm2_path), "-o",
                                 f"rpc={a.endpoint},{b.endpoint}", "-o", "num_predict=400", "-o", "temperature=0",
                                 "Count from one to one hundred, in words."], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=str(ROOT), env=_env())
        assert proc.stdout.read(8)  # generating
        a.kill()
        out, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 1
        lines = err.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and "runner" in lines[0], lines
        assert f"RPC server {a.endpoint} does not answer" in lines[0] and b.endpoint not in lines[0], lines
        assert out and out.endswith(b"\n")  # the partial answer keeps its own line before the error
    finally:
        a.kill()
        b.kill()


def test_rpc_server_warns_off_loopback_refuses_a_taken_port_and_stops_on_ctrl_c():
    import signal

    from ollapy.rpc_endpoint import probe_endpoint

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "rpc-server", "--host", "0.0.0.0", "--port",
                             str(port), "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=str(ROOT), env=_env())
    try:
        warning = proc.stderr.readline().decode()
        assert warning.startswith("warning: the RPC protocol has no authentication") and "0.0.0.0" in warning
        assert proc.stdout.readline().decode().startswith("Starting RPC server v7.")  # ggml's own banner
        while True:  # the banner comes before ggml listens: the event is a completed handshake
            try:
                assert probe_endpoint(f"127.0.0.1:{port}")[0] == 7
                break
            except Exception:  # noqa: BLE001 - not listening yet
                assert proc.poll() is None
        taken = run_cli("rpc-server", "--port", str(port), timeout=HANG_GUARD_S)
        assert taken.returncode == 1
        lines = taken.stderr.decode().splitlines()
        assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], lines
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0
        assert err.decode().splitlines() == ["rpc-server stopped"]
    finally:
        proc.kill()
        proc.wait()


def test_serve_option_sets_rpc_for_every_model_and_a_request_cannot(smollm2_path, tmp_path):
    """`serve -o rpc=…` is the default of every model the server loads: an unreachable endpoint is a 502 naming it
    (the pre-flight check, no abort: the server answers the next request); a request's own `rpc` is a 400."""
    port = free_port()
    bad = run_cli("serve", "-o", "rpc=nowhere", timeout=HANG_GUARD_S)
    assert bad.returncode == 2 and len(bad.stderr.decode().splitlines()) == 1, bad.stderr.decode()
    with live_server(tmp_path, "--allow-paths", "-o", f"rpc=127.0.0.1:{port}") as url:
        body = {"model": str(smollm2_path), "prompt": PROMPT, "stream": False, "options": {"num_predict": 4}}
        for _ in range(2):
            r = httpx.post(f"{url}/api/generate", json=body, timeout=HANG_GUARD_S)
            assert r.status_code == 502 and f"127.0.0.1:{port}" in r.json()["error"], r.text
        r = httpx.post(f"{url}/api/generate", json={**body, "options": {"rpc": "10.0.0.1:1"}}, timeout=HANG_GUARD_S)
        assert r.status_code == 400 and "cannot be set by a request" in r.json()["error"], r.text
