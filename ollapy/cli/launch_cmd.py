"""``ollapy launch claude|codex [--model M] [-- ARGS]``: start a coding agent against ``ollapy serve``.

As Ollama's ``ollama launch``: find the server at ``OLLAPY_HOST`` (or start ``ollapy serve`` there in the
background, its log under the state directory), pick the model (``--model``, else the first model of the store
whose context holds :data:`MIN_CONTEXT` tokens), set the agent's environment and exec it with ``ARGS``:

* Claude Code (``claude``, npm ``@anthropic-ai/claude-code``) speaks Anthropic's Messages API:
  ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN``, ``ANTHROPIC_MODEL`` (and the small/fast and per-tier model
  variables, so that no request names a Claude model), ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``,
  ``--model M``.
* Codex (``codex``, npm ``@openai/codex``) in its Ollama mode: ``OLLAMA_HOST``, ``CODEX_OSS_BASE_URL``,
  ``--oss --local-provider=ollama -m M`` (after ``exec`` when ARGS start with it), and ``CODEX_HOME`` outside
  the temporary directory (Codex refuses one there).

``OLLAPY_API_KEY``, when set, is the agent's key. A missing agent, a model whose context is too small or a
server that does not come up is one line saying what to do, and exit 1.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import platformdirs
import typer

from ollapy import config
from ollapy.errors import OllapyError, UsageError

MIN_CONTEXT = 32768
"""Context (num_ctx, tokens) a model needs for an agent: Claude Code's and Codex's system prompts and tool lists
run to many thousand tokens, and the conversation grows on top of them (Ollama's docs ask for at least 32k)."""

AGENTS = {"claude": "npm install -g @anthropic-ai/claude-code", "codex": "npm install -g @openai/codex"}
SERVER_START_S = 120.0  # how long a started `ollapy serve` may take to answer (a guard, not a measurement)
TEMP_ROOTS = tuple({os.path.realpath(tempfile.gettempdir()), "/tmp"})


def model_context(show: dict) -> int:
    """The context (tokens) a model runs with on the server: its Modelfile's ``num_ctx`` (``/api/show``'s
    ``parameters``), else this environment's ``OLLAPY_CONTEXT_LENGTH`` (the default of a server started here)."""
    m = re.search(r"^num_ctx\s+(\d+)\s*$", show.get("parameters") or "", re.MULTILINE)
    return int(m.group(1)) if m else config.num_ctx()


def ensure_server(client) -> str:
    """The URL of the ``ollapy serve`` at ``OLLAPY_HOST``: one that answers, else one started now in the
    background (its stdout and stderr go to ``STATE_DIR/serve.log``). Raises OllapyError when it does not come up."""
    if client.heartbeat():
        return client.host
    log_path = config.state_dir() / "serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    print(f"started ollapy serve at {client.host} (pid {proc.pid}, log {log_path})", file=sys.stderr)
    end = time.monotonic() + SERVER_START_S
    while time.monotonic() < end:
        if client.heartbeat():
            return client.host
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise OllapyError(f"ollapy serve did not start at {client.host}", hint=f"see {log_path}")


def pick_model(client, name: str | None) -> str:
    """The model to give the agent, named as ``/api/tags`` lists it (``NAME:TAG``: Codex pulls a model it does not
    find there by that exact name): ``name`` when its context holds :data:`MIN_CONTEXT` tokens, else (no name)
    the first such model of the server's store. Raises OllapyError naming what to do otherwise."""
    listed = [m["name"] for m in client.http.get("/api/tags").json().get("models", [])]
    if name:
        ctx = model_context(client.show(name))
        if ctx < MIN_CONTEXT:
            raise OllapyError(f"{name} runs with a context of {ctx} tokens; agents need at least {MIN_CONTEXT}",
                              hint=f"create a model with `PARAMETER num_ctx {MIN_CONTEXT}` in its Modelfile (FROM "
                                   f"{name}) and pass it with --model")
        return name if name in listed or f"{name}:latest" not in listed else f"{name}:latest"
    for n in listed:
        if model_context(client.show(n)) >= MIN_CONTEXT:
            return n
    raise OllapyError(f"no model on the server has a context of at least {MIN_CONTEXT} tokens",
                      hint=f"create one with `PARAMETER num_ctx {MIN_CONTEXT}` in its Modelfile, or pass --model")


def _outside_temp(path: str) -> bool:
    real = os.path.realpath(path)
    return not any(real == t or real.startswith(t + os.sep) for t in TEMP_ROOTS)


def agent_command(agent: str, exe: str, url: str, model: str, args: list[str], env: dict) -> tuple[list[str], dict]:
    """``(argv, env)`` to exec ``agent`` (its executable ``exe``) against the server at ``url`` with ``model``;
    ``env`` is the environment to start from (not changed)."""
    env = dict(env)
    key = config.api_key()
    if agent == "claude":
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_AUTH_TOKEN=key or "ollapy", ANTHROPIC_MODEL=model,
                   ANTHROPIC_SMALL_FAST_MODEL=model, ANTHROPIC_DEFAULT_OPUS_MODEL=model,
                   ANTHROPIC_DEFAULT_SONNET_MODEL=model, ANTHROPIC_DEFAULT_HAIKU_MODEL=model,
                   CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        env.pop("ANTHROPIC_API_KEY", None)  # a real Anthropic key would be sent to ollapy and preferred
        return [exe, "--model", model, *args], env
    env.update(OLLAMA_HOST=url, CODEX_OSS_BASE_URL=url + "/v1")
    if key:
        env["OLLAMA_API_KEY"] = key
    home = env.get("CODEX_HOME") or str(Path.home() / ".codex")
    if not _outside_temp(home):  # Codex refuses a CODEX_HOME in the temporary directory
        home = str(Path(platformdirs.user_data_dir("ollapy")) / "codex")
    env["CODEX_HOME"] = home
    Path(home).mkdir(parents=True, exist_ok=True)
    flags = ["--oss", "--local-provider=ollama", "-m", model]
    if args and args[0] in ("exec", "e"):
        return [exe, args[0], *flags, *args[1:]], env
    return [exe, *flags, *args], env


def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="The agent to start: claude (Claude Code) or codex (Codex CLI)."),
    model: str = typer.Option(None, "--model", "-m", help=f"Model to use (default: the first with num_ctx >= "
                                                           f"{MIN_CONTEXT})."),
) -> None:
    """Start a coding agent (claude or codex) against ollapy serve; arguments after -- go to the agent."""
    from ollapy.cli.client import Client

    if agent not in AGENTS:
        raise UsageError(f"unknown agent {agent!r}", hint="use claude or codex")
    exe = shutil.which(agent)
    if exe is None:
        raise OllapyError(f"{agent} is not on PATH", hint=f"install it: {AGENTS[agent]}")
    client = Client(timeout=30)
    try:
        url = ensure_server(client)
        name = pick_model(client, model)
    finally:
        client.close()
    argv, env = agent_command(agent, exe, url, name, list(ctx.args), dict(os.environ))
    print(f"launching {agent} with {name} at {url}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os.execve(exe, argv, env)


def register(app: typer.Typer) -> None:
    """Add ``launch`` to the app."""
    app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch)
