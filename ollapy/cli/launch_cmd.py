"""``ollapy launch AGENT [--model M] [--config] [-- ARGS]``: start a coding agent against ``ollapy serve``.

As Ollama's ``ollama launch``: find the server at ``OLLAPY_HOST`` (or start ``ollapy serve`` there in the
background, its log under the state directory), pick the model (``--model``, else the first model of the store
whose context holds :data:`MIN_CONTEXT` tokens), set the agent's environment and exec it with ``ARGS``. Each
agent is told the model's real context (``num_ctx``, :func:`model_context`), so that it compacts its
conversation before it overflows, and the output it may ask for is bounded to what that context leaves
(:func:`output_bound`):

* Claude Code (``claude``, npm ``@anthropic-ai/claude-code``) speaks Anthropic's Messages API:
  ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN``, ``ANTHROPIC_MODEL`` (and the small/fast, per-tier and
  subagent model variables, so that no request names a Claude model), ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``,
  ``--model M``. What keeps its prompt the same from request to request (a prompt cache hit from the top):
  ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` (no per-request attribution line in the system prompt) and
  ``CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off`` (no token countdown inserted into the conversation), as
  ``ollama launch claude`` sets. The context: Claude Code 2.1 takes no compaction window under 100k tokens, so a
  smaller context is the percentage of that window where it compacts (:func:`claude_compaction`), and
  ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` (the window itself, which Claude Code reads where compaction is off); the
  output: ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``.
* Codex (``codex``, npm ``@openai/codex``) in its Ollama mode: ``OLLAMA_HOST``, ``CODEX_OSS_BASE_URL``,
  ``--oss --local-provider=ollama -m M`` and ``-c model_context_window=N -c model_auto_compact_token_limit=L``
  (after ``exec`` when ARGS start with it), and ``CODEX_HOME`` outside the temporary directory (Codex refuses
  one there: a ``CODEX_HOME`` or ``HOME`` under it is replaced by one under ollapy's data directory). Codex 0.171
  has no setting for its output budget (``model_max_output_tokens`` is gone): the auto-compact limit leaves
  :func:`output_bound` tokens of the context free instead. Nor one for parallel calls: it always sends
  ``parallel_tool_calls: true`` (``ollama launch codex`` writes a ``model_catalog_json`` entry with
  ``supports_parallel_tool_calls: false``, a field Codex 0.171's model metadata no longer has and drops; only its
  internal ``use_responses_lite`` turns the flag off, and with it the request carries no ``tools``), so no
  catalog is written.
* opencode (``opencode``, npm ``opencode-ai``), as ``ollama launch opencode``: a provider ``ollapy`` of
  ``@ai-sdk/openai-compatible`` pointing at ``/v1``, with the model and its ``limit`` (context and output), given
  in ``OPENCODE_CONFIG_CONTENT`` (opencode merges it over the user's own configuration; no file is written), and
  ``--model ollapy/M`` after ``run`` when ARGS start with it.

pi, Qwen Code, Droid, Cline, Kilo and Crush: :mod:`ollapy.cli.launch_agents` (some read a configuration file,
which launch merges its entries into: :class:`~ollapy.cli.launch_agents.ConfigEdit`).

``OLLAPY_API_KEY``, when set, is the agent's key. ``--config`` prints what would be set (the variables as
``export`` lines, the file edits as ``# merge into PATH: JSON`` comments, then the command) and runs nothing: no
agent, no file written, and no server is started (one must answer).
A missing agent, a model whose context is too small or a server that does not come up is one line saying what
to do, and exit 1.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs
import typer

from ollapy import config
from ollapy.cli.launch_agents import AGENTS as EXTRA_AGENTS
from ollapy.cli.launch_agents import BUILDERS, ConfigEdit
from ollapy.errors import OllapyError, UsageError

MIN_CONTEXT = 32768
"""Context (num_ctx, tokens) a model needs for an agent: Claude Code's and Codex's system prompts and tool lists
run to many thousand tokens, and the conversation grows on top of them (Ollama's docs ask for at least 32k)."""

MAX_AGENT_OUTPUT = 32000
"""The most output tokens an agent is allowed to ask for (Claude Code's own default for its models)."""

AGENTS = {"claude": "npm install -g @anthropic-ai/claude-code", "codex": "npm install -g @openai/codex",
          "opencode": "npm install -g opencode-ai", **EXTRA_AGENTS}
SERVER_START_S = 120.0  # how long a started `ollapy serve` may take to answer (a guard, not a measurement)
TEMP_ROOTS = tuple({os.path.realpath(tempfile.gettempdir()), "/tmp"})


def output_bound(context: int) -> int:
    """Output tokens an agent may ask for with a model of ``context`` tokens: a quarter of it (the rest holds
    the agent's system prompt, tools and conversation: Claude Code's and Codex's run to 5,000-20,000 tokens
    with tools), at least 1,024 and at most :data:`MAX_AGENT_OUTPUT`."""
    return max(1024, min(MAX_AGENT_OUTPUT, context // 4))


def model_context(show: dict, running: list[dict] | None = None, name: str | None = None) -> int:
    """The context (tokens) a model runs with on the server: its Modelfile's ``num_ctx`` (``/api/show``'s
    ``parameters``), else the ``context_length`` it is loaded with now (``running``: ``/api/ps``'s models), else
    this environment's ``OLLAPY_CONTEXT_LENGTH`` (the default of a server started here)."""
    m = re.search(r"^num_ctx\s+(\d+)\s*$", show.get("parameters") or "", re.MULTILINE)
    if m:
        return int(m.group(1))
    for r in running or ():
        if name is not None and r.get("name") in (name, f"{name}:latest") and r.get("context_length"):
            return int(r["context_length"])
    return config.num_ctx()


def ensure_server(client, start: bool = True) -> str:
    """The URL of the ``ollapy serve`` at ``OLLAPY_HOST``: one that answers, else (``start``) one started now in
    the background (its stdout and stderr go to ``STATE_DIR/serve.log``). Raises OllapyError when none answers."""
    if client.heartbeat():
        return client.host
    if not start:
        raise OllapyError(f"no ollapy serve answers at {client.host}",
                          hint="start one (ollapy serve), or run launch without --config to start it")
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


def pick_model(client, name: str | None) -> tuple[str, int]:
    """``(model, context)``: the model to give the agent, named as ``/api/tags`` lists it (``NAME:TAG``: Codex
    pulls a model it does not find there by that exact name), and its context (:func:`model_context`):
    ``name`` when its context holds :data:`MIN_CONTEXT` tokens, else (no name) the first such model of the
    server's store. Raises OllapyError naming what to do otherwise."""
    listed = [m["name"] for m in client.http.get("/api/tags").json().get("models", [])]
    running = client.http.get("/api/ps").json().get("models", [])
    if name:
        ctx = model_context(client.show(name), running, name)
        if ctx < MIN_CONTEXT:
            raise OllapyError(f"{name} runs with a context of {ctx} tokens; agents need at least {MIN_CONTEXT}",
                              hint=f"create a model with `PARAMETER num_ctx {MIN_CONTEXT}` in its Modelfile (FROM "
                                   f"{name}) and pass it with --model")
        return (name if name in listed or f"{name}:latest" not in listed else f"{name}:latest"), ctx
    for n in listed:
        ctx = model_context(client.show(n), running, n)
        if ctx >= MIN_CONTEXT:
            return n, ctx
    raise OllapyError(f"no model on the server has a context of at least {MIN_CONTEXT} tokens",
                      hint=f"create one with `PARAMETER num_ctx {MIN_CONTEXT}` in its Modelfile, or pass --model")


def _outside_temp(path: str) -> bool:
    real = os.path.realpath(path)
    return not any(real == t or real.startswith(t + os.sep) for t in TEMP_ROOTS)


def _bounded(env: dict, name: str, bound: int) -> str:
    """``bound``, or the user's own smaller positive value of ``name`` in ``env``."""
    try:
        own = int(env.get(name, ""))
    except ValueError:
        own = 0
    return str(own if 0 < own < bound else bound)


@dataclass
class LaunchPlan:
    """What ``launch`` runs: ``argv`` (executable first), the variables it sets (``set``) and removes
    (``unset``) in the agent's environment, directories to create and configuration files to edit first."""

    argv: list[str]
    set: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    edits: list[ConfigEdit] = field(default_factory=list)

    def env(self, base: dict) -> dict:
        """``base`` with this plan's changes."""
        out = {k: v for k, v in base.items() if k not in self.unset}
        out.update(self.set)
        return out

    def describe(self) -> str:
        """The plan as shell lines: ``unset``/``export`` lines, the file edits (comments), then the command."""
        lines = [f"unset {k}" for k in self.unset]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.set.items()]
        lines += [e.describe() for e in self.edits]
        lines.append(shlex.join(self.argv))
        return "\n".join(lines)


CLAUDE_MIN_WINDOW = 100_000
"""The smallest compaction window Claude Code 2.1 accepts (``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` below it is read as
it, with a warning)."""


def claude_compaction(context: int) -> dict[str, str]:
    """Claude Code's variables that make it compact a conversation before ``context`` tokens: the window
    (``CLAUDE_CODE_AUTO_COMPACT_WINDOW``, at least :data:`CLAUDE_MIN_WINDOW`) and, for a smaller context, the
    percentage of that window where compaction fires (``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE``), which leaves
    :func:`output_bound` tokens of the context for the answer."""
    window = max(context, CLAUDE_MIN_WINDOW)
    out = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window)}
    if context < window:
        out["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] = str(max(1, 100 * (context - output_bound(context)) // window))
    return out


def _claude(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None) -> LaunchPlan:
    s = dict(ANTHROPIC_BASE_URL=url, ANTHROPIC_AUTH_TOKEN=key or "ollapy", ANTHROPIC_MODEL=model,
             ANTHROPIC_SMALL_FAST_MODEL=model, ANTHROPIC_DEFAULT_OPUS_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model,
             ANTHROPIC_DEFAULT_HAIKU_MODEL=model, CLAUDE_CODE_SUBAGENT_MODEL=model,
             CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
             # the same prompt request after request: no attribution line, no token countdown
             CLAUDE_CODE_ATTRIBUTION_HEADER="0", CLAUDE_CODE_TOTAL_TOKENS_REMINDER="off",
             CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(context),
             CLAUDE_CODE_MAX_OUTPUT_TOKENS=_bounded(env, "CLAUDE_CODE_MAX_OUTPUT_TOKENS", output_bound(context)),
             **claude_compaction(context))
    # a real Anthropic key would be sent to ollapy and preferred over the token
    return LaunchPlan([exe, "--model", model, *args], s, unset=["ANTHROPIC_API_KEY"])


def codex_home(env: dict) -> str:
    """Codex's home for ``env``: its ``CODEX_HOME``, else ``$HOME/.codex``; one in the temporary directory
    (Codex refuses it) is replaced by ``codex`` under ollapy's data directory, itself kept out of it."""
    home = env.get("CODEX_HOME") or str(Path(env.get("HOME") or Path.home()) / ".codex")
    if _outside_temp(home):
        return home
    data = Path(platformdirs.user_data_dir("ollapy"))
    if not _outside_temp(str(data)):  # HOME itself in /tmp: XDG paths follow it
        data = Path("/var/tmp" if _outside_temp("/var/tmp") else "/") / f"ollapy-{os.getuid()}"
    return str(data / "codex")


def _codex(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None) -> LaunchPlan:
    s = {"OLLAMA_HOST": url, "CODEX_OSS_BASE_URL": url + "/v1"}
    if key:
        s["OLLAMA_API_KEY"] = key
    home = codex_home(env)
    s["CODEX_HOME"] = home
    flags = ["--oss", "--local-provider=ollama", "-m", model, "-c", f"model_context_window={context}",
             "-c", f"model_auto_compact_token_limit={context - output_bound(context)}"]
    if args and args[0] in ("exec", "e"):
        argv = [exe, args[0], *flags, *args[1:]]
    else:
        argv = [exe, *flags, *args]
    return LaunchPlan(argv, s, dirs=[home])


def opencode_config(url: str, model: str, context: int, key: str | None) -> dict:
    """opencode's configuration for ollapy at ``url``: a provider ``ollapy`` (``@ai-sdk/openai-compatible`` on
    ``/v1``) with ``model`` and its limits, and ``model`` as the default (``ollapy/MODEL``)."""
    options: dict = {"baseURL": url + "/v1"}
    if key:
        options["apiKey"] = key
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {"ollapy": {"npm": "@ai-sdk/openai-compatible", "name": "ollapy", "options": options,
                                    "models": {model: {"name": model, "limit": {"context": context,
                                                                                "output": output_bound(context)}}}}},
            "model": f"ollapy/{model}"}


def _opencode(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None) -> LaunchPlan:
    s = {"OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(url, model, context, key), separators=(",", ":"))}
    if args and args[0] == "run":
        return LaunchPlan([exe, "run", "--model", f"ollapy/{model}", *args[1:]], s)
    return LaunchPlan([exe, *args], s)


def agent_plan(agent: str, exe: str, url: str, model: str, context: int, args: list[str], env: dict) -> LaunchPlan:
    """What to run for ``agent`` (its executable ``exe``) against the server at ``url`` with ``model`` of
    ``context`` tokens; ``env`` is the environment it starts from (read, not changed)."""
    build = {"claude": _claude, "codex": _codex, "opencode": _opencode, **BUILDERS}[agent]
    return build(exe, url, model, context, list(args), env, config.api_key())


def launch(
    ctx: typer.Context,
    agent: str = typer.Argument(..., help="The agent to start: claude (Claude Code), codex (Codex CLI), opencode, "
                                          "pi, qwen (Qwen Code), droid, cline, kilo or crush."),
    model: str = typer.Option(None, "--model", "-m", help=f"Model to use (default: the first with num_ctx >= "
                                                           f"{MIN_CONTEXT})."),
    show_config: bool = typer.Option(False, "--config", help="Print the variables and command it would run, and "
                                                            "run nothing."),
) -> None:
    """Start a coding agent (claude, codex, opencode, pi, qwen, droid, cline, kilo, crush) against ollapy serve;
    arguments after -- go to the agent."""
    from ollapy.cli.client import Client

    if agent not in AGENTS:
        raise UsageError(f"unknown agent {agent!r}", hint="use " + ", ".join(AGENTS))
    exe = shutil.which(agent)
    if exe is None and not show_config:
        raise OllapyError(f"{agent} is not on PATH", hint=f"install it: {AGENTS[agent]}")
    client = Client(timeout=30)
    try:
        url = ensure_server(client, start=not show_config)
        name, context = pick_model(client, model)
    finally:
        client.close()
    plan = agent_plan(agent, exe or agent, url, name, context, list(ctx.args), dict(os.environ))
    if show_config:
        print(plan.describe())
        return
    for d in plan.dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
    for edit in plan.edits:
        edit.apply()
    print(f"launching {agent} with {name} (context {context}, output up to {output_bound(context)}) at {url}",
          file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os.execve(exe, plan.argv, plan.env(dict(os.environ)))


def register(app: typer.Typer) -> None:
    """Add ``launch`` to the app."""
    app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch)
