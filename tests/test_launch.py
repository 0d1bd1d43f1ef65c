"""``ollapy launch claude|codex`` against a live ``ollapy serve``, with fake agent executables on PATH that record
the arguments and environment they are started with (a new CLI process each time, as a user runs it)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import live_api, run_cli

FAKE_AGENT = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_AGENT_OUT"], "w") as f:
    json.dump({{"argv0": sys.argv[0], "args": sys.argv[1:], "env": dict(os.environ)}}, f)
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory, smollm2_path):
    models = {"small": {}, "big": {"parameters": {"num_ctx": 32768}}}
    with live_api(tmp_path_factory.mktemp("launch"), smollm2_path, models) as api:
        yield api


@pytest.fixture
def agents(tmp_path):
    """A bin directory holding fake ``claude`` and ``codex``; returns (bin dir, record file)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("claude", "codex"):
        p = bindir / name
        p.write_text(FAKE_AGENT)
        p.chmod(0o755)
    return bindir, tmp_path / "record.json"


def _launch(api, agents, *args, extra_env: dict | None = None):
    bindir, out = agents
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_AGENT_OUT": str(out),
           "OLLAPY_HOST": api.url.removeprefix("http://"), **(extra_env or {})}
    p = run_cli("launch", *args, env=env)
    record = json.loads(out.read_text()) if out.exists() else None
    return p, record


def test_claude_gets_the_server_and_model(api, agents):
    p, rec = _launch(api, agents, "claude", "--model", "big", "--", "-p", "Reply with: ready")
    assert p.returncode == 0, p.stderr
    assert rec["argv0"] == str(agents[0] / "claude")
    assert rec["args"] == ["--model", "big:latest", "-p", "Reply with: ready"]
    env = rec["env"]
    assert env["ANTHROPIC_BASE_URL"] == api.url and env["ANTHROPIC_MODEL"] == "big:latest"
    assert env["ANTHROPIC_AUTH_TOKEN"] == "ollapy" and "ANTHROPIC_API_KEY" not in env
    assert env["ANTHROPIC_SMALL_FAST_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "big:latest"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert p.stderr.decode().strip() == f"launching claude with big:latest at {api.url}"


def test_codex_gets_oss_flags_after_exec(api, agents, tmp_path):
    p, rec = _launch(api, agents, "codex", "--model", "big", "--", "exec", "--skip-git-repo-check", "hi",
                     extra_env={"OLLAPY_API_KEY": "sekrit", "CODEX_HOME": str(tmp_path / "codex-home")})
    assert p.returncode == 0, p.stderr
    assert rec["args"] == ["exec", "--oss", "--local-provider=ollama", "-m", "big:latest", "--skip-git-repo-check", "hi"]
    env = rec["env"]
    assert env["OLLAMA_HOST"] == api.url and env["CODEX_OSS_BASE_URL"] == api.url + "/v1"
    assert env["OLLAMA_API_KEY"] == "sekrit"
    home = Path(env["CODEX_HOME"])  # Codex refuses a home in the temporary directory: one outside it is used
    assert home != tmp_path / "codex-home" and not str(home.resolve()).startswith("/tmp/") and home.is_dir()
    p, rec = _launch(api, agents, "codex", "--model", "big:latest")  # interactive: the flags alone
    assert rec["args"] == ["--oss", "--local-provider=ollama", "-m", "big:latest"]


def test_default_model_is_one_with_a_large_context(api, agents):
    p, rec = _launch(api, agents, "claude", extra_env={"OLLAPY_API_KEY": "k1"})
    assert p.returncode == 0, p.stderr
    assert rec["args"] == ["--model", "big:latest"] and rec["env"]["ANTHROPIC_AUTH_TOKEN"] == "k1"


def test_small_context_and_missing_agent_are_one_line(api, agents, tmp_path):
    p, rec = _launch(api, agents, "claude", "--model", "small")
    assert p.returncode == 1 and rec is None
    assert p.stderr.decode() == ("Error: small runs with a context of 4096 tokens; agents need at least 32768 (create a "
                                 "model with `PARAMETER num_ctx 32768` in its Modelfile (FROM small) and pass it with "
                                 "--model)\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    p = run_cli("launch", "codex", env={"PATH": str(empty), "OLLAPY_HOST": api.url.removeprefix("http://")})
    assert p.returncode == 1
    assert p.stderr.decode() == "Error: codex is not on PATH (install it: npm install -g @openai/codex)\n"
    p = run_cli("launch", "cursor")
    assert p.returncode == 2 and p.stderr.decode() == "Error: unknown agent 'cursor' (use claude or codex)\n"


def test_starts_a_server_when_none_answers(agents, tmp_path, smollm2_path):
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"OLLAPY_CONTEXT_LENGTH": "32768", "OLLAPY_MODELS": str(tmp_path / "models"),
           "OLLAPY_CACHE_DIR": str(tmp_path / "cache"), "XDG_STATE_HOME": str(tmp_path / "state")}
    # a model in the store the started server will see (ollapy create, as a user makes one)
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\n")
    assert run_cli("create", "m", "-f", str(tmp_path / "Modelfile"), env=env).returncode == 0
    p, rec = _launch(type("A", (), {"url": f"http://127.0.0.1:{port}"}), agents, "claude", extra_env=env)
    err = p.stderr.decode()
    pid = int(err.split("(pid ")[1].split(",")[0])
    try:
        assert p.returncode == 0, err
        assert err.startswith(f"started ollapy serve at http://127.0.0.1:{port} (pid {pid}, log ")
        assert rec["args"] == ["--model", "m:latest"] and rec["env"]["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"
        assert httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=10).status_code == 200  # still serving
    finally:
        os.kill(pid, signal.SIGTERM)
