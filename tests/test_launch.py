"""``ollapy launch claude|codex|opencode`` against a live ``ollapy serve``, with fake agent executables on PATH that record
the arguments and environment they are started with (a new CLI process each time, as a user runs it)."""
from __future__ import annotations

import json
import os
import re
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
    for name in ("claude", "codex", "opencode"):
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
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["CLAUDE_CODE_SUBAGENT_MODEL"] == "big:latest"
    # the prompt stays the same from request to request (a cache hit from its top)
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["CLAUDE_CODE_TOTAL_TOKENS_REMINDER"] == "off"
    # the model's real context (32768 in its Modelfile), and a quarter of it for the output
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    # Claude Code takes no compaction window under 100k: it compacts at 24% of 100k, before 32768 - 8192 tokens
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "100000" and env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "24"
    assert p.stderr.decode().strip() == f"launching claude with big:latest (context 32768, output up to 8192) at {api.url}"


def test_codex_gets_oss_flags_after_exec(api, agents, tmp_path):
    p, rec = _launch(api, agents, "codex", "--model", "big", "--", "exec", "--skip-git-repo-check", "hi",
                     extra_env={"OLLAPY_API_KEY": "sekrit", "CODEX_HOME": str(tmp_path / "codex-home")})
    assert p.returncode == 0, p.stderr
    assert rec["args"] == ["exec", "--oss", "--local-provider=ollama", "-m", "big:latest", "-c", "model_context_window=32768",
                           "-c", "model_auto_compact_token_limit=24576", "--skip-git-repo-check", "hi"]
    env = rec["env"]
    assert env["OLLAMA_HOST"] == api.url and env["CODEX_OSS_BASE_URL"] == api.url + "/v1"
    assert env["OLLAMA_API_KEY"] == "sekrit"
    home = Path(env["CODEX_HOME"])  # Codex refuses a home in the temporary directory: one outside it is used
    assert home != tmp_path / "codex-home" and not str(home.resolve()).startswith("/tmp/") and home.is_dir()
    p, rec = _launch(api, agents, "codex", "--model", "big:latest")  # interactive: the flags alone
    assert rec["args"][:4] == ["--oss", "--local-provider=ollama", "-m", "big:latest"] and len(rec["args"]) == 8


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
    assert p.returncode == 2 and p.stderr.decode() == ("Error: unknown agent 'cursor' (use claude, codex, opencode, pi, "
                                                       "qwen, droid, cline, kilo, crush)\n")


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


def test_an_output_limit_of_the_user_is_kept_when_smaller(api, agents):
    p, rec = _launch(api, agents, "claude", "--model", "big", extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "128"})
    assert p.returncode == 0, p.stderr
    assert rec["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "128"
    p, rec = _launch(api, agents, "claude", "--model", "big", extra_env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64000"})
    assert rec["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"


def test_codex_home_never_in_the_temporary_directory(api, agents, tmp_path):
    """A HOME (and XDG data directory) under /tmp: Codex's home goes elsewhere, and exists."""
    env = {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    p, rec = _launch(api, agents, "codex", "--model", "big", "--", "exec", "hi", extra_env=env)
    assert p.returncode == 0, p.stderr
    home = Path(rec["env"]["CODEX_HOME"])
    assert home.is_dir() and not str(home.resolve()).startswith(("/tmp/", str(Path(tmp_path).resolve())))


def test_opencode_gets_a_provider_on_v1(api, agents):
    p, rec = _launch(api, agents, "opencode", "--model", "big", "--", "run", "Reply with: ready",
                     extra_env={"OLLAPY_API_KEY": "k2"})
    assert p.returncode == 0, p.stderr
    assert rec["args"] == ["run", "--model", "ollapy/big:latest", "Reply with: ready"]
    cfg = json.loads(rec["env"]["OPENCODE_CONFIG_CONTENT"])
    provider = cfg["provider"]["ollapy"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": api.url + "/v1", "apiKey": "k2"}
    assert provider["models"] == {"big:latest": {"name": "big:latest", "limit": {"context": 32768, "output": 8192}}}
    assert cfg["model"] == "ollapy/big:latest"
    p, rec = _launch(api, agents, "opencode", "--model", "big")  # the TUI: no arguments added
    assert rec["args"] == [] and "OPENCODE_CONFIG_CONTENT" in rec["env"]


def test_config_prints_what_it_would_set_and_runs_nothing(api, agents, tmp_path):
    import shlex

    bindir, out = agents
    p, rec = _launch(api, agents, "claude", "--model", "big", "--config", "--", "-p", "hi there")
    assert p.returncode == 0, p.stderr
    assert rec is None  # the agent did not run
    lines = p.stdout.decode().splitlines()
    assert lines[0] == "unset ANTHROPIC_API_KEY"
    exports = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines if line.startswith("export "))
    assert exports["ANTHROPIC_BASE_URL"] == api.url and exports["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert exports["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert shlex.split(lines[-1]) == [str(bindir / "claude"), "--model", "big:latest", "-p", "hi there"]
    # without the agent installed, and the opencode config as one quoted JSON value
    empty = tmp_path / "empty"
    empty.mkdir()
    p = run_cli("launch", "opencode", "-m", "big", "--config", "--", "run", "x",
                env={"PATH": str(empty), "OLLAPY_HOST": api.url.removeprefix("http://")})
    assert p.returncode == 0, p.stderr
    first, cmd = p.stdout.decode().splitlines()
    value = shlex.split(first.removeprefix("export "))[0].split("=", 1)[1]
    assert json.loads(value)["provider"]["ollapy"]["options"]["baseURL"] == api.url + "/v1"
    assert shlex.split(cmd) == ["opencode", "run", "--model", "ollapy/big:latest", "x"]
    # --config starts no server: one that does not answer is one line
    p = run_cli("launch", "claude", "--config", env={"OLLAPY_HOST": "127.0.0.1:9"})
    assert p.returncode == 1
    assert p.stderr.decode() == ("Error: no ollapy serve answers at http://127.0.0.1:9 (start one (ollapy serve), or run "
                                 "launch without --config to start it)\n")


def test_claude_compaction_for_contexts_below_and_above_its_minimum_window():
    from ollapy.cli.launch_cmd import claude_compaction

    assert claude_compaction(32768) == {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "24"}
    assert claude_compaction(8192) == {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "6"}
    assert claude_compaction(131072) == {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "131072"}


def _config(api, tmp_path, agent: str, *args: str, extra_env: dict | None = None) -> tuple[dict, list, list[str]]:
    """``launch AGENT --model big --config -- ARGS`` with no agent installed and HOME in ``tmp_path``: (exports, file
    edits as (path, JSON), the command); asserts that nothing was written under HOME."""
    import shlex

    empty, home = tmp_path / "empty", tmp_path / "home"
    empty.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    env = {"PATH": str(empty), "HOME": str(home), "OLLAPY_HOST": api.url.removeprefix("http://"),
           "XDG_STATE_HOME": str(tmp_path / "state"), **(extra_env or {})}
    p = run_cli("launch", agent, "--model", "big", "--config", "--", *args, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    exports = dict(shlex.split(x.removeprefix("export "))[0].split("=", 1) for x in lines if x.startswith("export "))
    edits = [(x.split(": ", 1)[0].removeprefix("# merge into "), json.loads(x.split(": ", 1)[1]))
             for x in lines if x.startswith("# merge into ")]
    assert list(home.iterdir()) == [] and not (tmp_path / "state").exists()  # --config writes nothing
    return exports, edits, shlex.split(lines[-1])


def test_pi_config_is_a_provider_in_its_models_json(api, tmp_path):
    exports, edits, cmd = _config(api, tmp_path, "pi", "-p", "hi")
    assert exports == {} and cmd == ["pi", "--provider", "ollapy", "--model", "big:latest", "-p", "hi"]
    [(path, patch)] = edits
    assert path == str(tmp_path / "home" / ".pi" / "agent" / "models.json")
    assert patch == {"providers": {"ollapy": {
        "baseUrl": api.url + "/v1", "api": "openai-completions", "apiKey": "ollapy",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "big:latest", "name": "big:latest", "input": ["text"], "contextWindow": 32768,
                    "maxTokens": 8192}]}}}
    _, edits, _ = _config(api, tmp_path, "pi", extra_env={"PI_CODING_AGENT_DIR": str(tmp_path / "pi")})
    assert edits[0][0] == str(tmp_path / "pi" / "models.json")


def test_qwen_config_is_its_openai_mode_with_the_context_in_its_defaults(api, tmp_path):
    exports, edits, cmd = _config(api, tmp_path, "qwen", "Reply with: ready", extra_env={"OLLAPY_API_KEY": "k3"})
    assert cmd == ["qwen", "--auth-type", "openai", "-m", "big:latest", "Reply with: ready"]
    defaults = str(tmp_path / "state" / "ollapy" / "qwen" / "system-defaults.json")
    assert exports == {"OPENAI_BASE_URL": api.url + "/v1", "OPENAI_API_KEY": "k3", "OPENAI_MODEL": "big:latest",
                       "QWEN_CODE_MAX_OUTPUT_TOKENS": "8192", "QWEN_CODE_SYSTEM_DEFAULTS_PATH": defaults}
    # the context, and no background memory extraction (a second 7k-token request after every prompt)
    assert edits == [(defaults, {"model": {"generationConfig": {"contextWindowSize": 32768}},
                                 "memory": {"enableManagedAutoMemory": False}})]


def test_droid_config_is_a_custom_model_in_its_runtime_settings(api, tmp_path):
    exports, edits, cmd = _config(api, tmp_path, "droid", "exec", "hi")
    settings = str(tmp_path / "state" / "ollapy" / "droid" / "settings.json")
    assert exports == {} and cmd == ["droid", "exec", "--settings", settings, "-m", "custom:ollapy-big:latest", "hi"]
    assert edits == [(settings, {"customModels": [{"id": "custom:ollapy-big:latest", "model": "big:latest",
                                                   "displayName": "big:latest (ollapy)", "baseUrl": api.url + "/v1",
                                                   "apiKey": "ollapy", "provider": "generic-chat-completion-api",
                                                   "maxOutputTokens": 8192, "supportsImages": False}],
                                 "sessionDefaultSettings": {"model": "custom:ollapy-big:latest"}})]
    assert _config(api, tmp_path, "droid")[2] == ["droid", "--settings", settings]  # the TUI: its session default


def test_cline_config_is_its_openai_compatible_provider(api, tmp_path):
    exports, edits, cmd = _config(api, tmp_path, "cline", "hi")
    assert exports == {} and cmd == ["cline", "hi"]  # -P/-m would make Cline drop the base URL from the file
    [(path, patch)] = edits
    assert path == str(tmp_path / "home" / ".cline" / "data" / "settings" / "providers.json")
    assert patch["lastUsedProvider"] == "openai-compatible"
    # Cline's schema requires updatedAt (an ISO time in UTC): without it Cline replaces the file with its own default
    entry = patch["providers"]["openai-compatible"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["updatedAt"]), entry
    assert entry["settings"] == {
        "provider": "openai-compatible", "apiKey": "ollapy", "model": "big:latest", "baseUrl": api.url + "/v1",
        "contextWindow": 32768, "maxTokens": 8192}


def test_kilo_and_crush_configs(api, tmp_path):
    exports, edits, cmd = _config(api, tmp_path, "kilo", "run", "hi")
    assert edits == [] and cmd == ["kilo", "run", "--model", "ollapy/big:latest", "hi"]
    cfg = json.loads(exports["KILO_CONFIG_CONTENT"])
    assert cfg["provider"]["ollapy"]["options"]["baseURL"] == api.url + "/v1" and "$schema" not in cfg
    assert cfg["provider"]["ollapy"]["models"]["big:latest"]["limit"] == {"context": 32768, "output": 8192}
    exports, edits, cmd = _config(api, tmp_path, "crush", extra_env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert exports == {} and cmd == ["crush"]
    [(path, patch)] = edits
    assert path == str(tmp_path / "xdg" / "crush" / "crush.json")
    assert patch["providers"]["ollapy"] == {"name": "ollapy", "type": "openai-compat", "base_url": api.url + "/v1",
                                            "api_key": "ollapy", "models": [{"id": "big:latest", "name": "big:latest",
                                                                             "context_window": 32768,
                                                                             "default_max_tokens": 8192}]}
    assert patch["models"]["large"] == patch["models"]["small"] == {"model": "big:latest", "provider": "ollapy"}


def test_a_launch_merges_its_entries_into_the_agents_own_file(api, agents, tmp_path):
    """pi's models.json keeps the user's providers and models; ollapy's entry is replaced, not duplicated; a file
    that is not JSON is left alone and the launch is one line."""
    bindir, out = agents
    (bindir / "pi").write_text(FAKE_AGENT)
    (bindir / "pi").chmod(0o755)
    agent_dir = tmp_path / "pi-agent"
    agent_dir.mkdir()
    own = {"providers": {"mine": {"baseUrl": "http://x/v1", "models": [{"id": "m1"}]},
                         "ollapy": {"models": [{"id": "old", "contextWindow": 1}, {"id": "big:latest", "x": 1}]}},
           "other": True}
    (agent_dir / "models.json").write_text(json.dumps(own))
    for _ in range(2):
        p, rec = _launch(api, agents, "pi", "--model", "big", extra_env={"PI_CODING_AGENT_DIR": str(agent_dir)})
        assert p.returncode == 0, p.stderr
    got = json.loads((agent_dir / "models.json").read_text())
    assert got["other"] is True and got["providers"]["mine"] == own["providers"]["mine"]
    models = got["providers"]["ollapy"]["models"]
    assert [m["id"] for m in models] == ["old", "big:latest"] and models[1]["contextWindow"] == 32768
    assert models[1]["x"] == 1 and got["providers"]["ollapy"]["baseUrl"] == api.url + "/v1"
    assert rec["args"] == ["--provider", "ollapy", "--model", "big:latest"]
    (agent_dir / "models.json").write_text("{not json")
    p, _ = _launch(api, agents, "pi", "--model", "big", extra_env={"PI_CODING_AGENT_DIR": str(agent_dir)})
    assert p.returncode == 1 and p.stderr.decode().startswith(f"Error: {agent_dir / 'models.json'} is not a JSON object")
    assert (agent_dir / "models.json").read_text() == "{not json"
