"""The agents ``ollapy launch`` starts beyond Claude Code, Codex and opencode, and the configuration files they need.

Each builder returns a :class:`~ollapy.cli.launch_cmd.LaunchPlan` for ``ollapy serve`` at ``url``, a model of
``context`` tokens and its output bound (:func:`~ollapy.cli.launch_cmd.output_bound`). What each agent reads was
taken from its own docs and code (npm packages, checked at the versions named):

* pi (``pi``, npm ``@mariozechner/pi-coding-agent`` 0.73): custom providers live in ``models.json`` of its agent
  directory (``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent``). ollapy's provider ``ollapy`` (``openai-completions``
  on ``/v1``, no ``developer`` role and no ``reasoning_effort``: ``compat``) lists the model with its
  ``contextWindow`` and ``maxTokens``; ``--provider ollapy --model M``.
* Qwen Code (``qwen``, npm ``@qwen-code/qwen-code``): its OpenAI mode, ``--auth-type openai -m M`` with
  ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL``; the output bound in ``QWEN_CODE_MAX_OUTPUT_TOKENS``;
  the context (``model.generationConfig.contextWindowSize``, a setting only) in a settings file of ollapy's own,
  named by ``QWEN_CODE_SYSTEM_DEFAULTS_PATH`` (the lowest-priority settings layer: the user's own win), with its
  managed auto-memory off (``memory.enableManagedAutoMemory``: a second, memory-extracting request after each prompt).
* Droid (``droid``, npm ``@factory/cli`` 0.225): a custom model (``customModels``, provider
  ``generic-chat-completion-api`` on ``/v1``, ``maxOutputTokens``) made the session default, in a settings file of
  ollapy's own given as ``--settings`` (Droid merges it over the user's ``~/.factory/settings.json`` for that run
  only); ``exec -m ID``.
* Cline (``cline``, npm ``cline`` 3.0): its ``openai-compatible`` provider in
  ``~/.cline/data/settings/providers.json`` (what ``cline auth -p openai -b URL`` writes, plus the ``contextWindow``
  and ``maxTokens`` its schema takes, and the ``updatedAt`` it requires), made the last used one; no ``-P``/``-m``
  (with them Cline rewrites the provider's settings without its base URL and key).
* Kilo (``kilo``, npm ``@kilocode/cli`` 7, an opencode fork): opencode's provider configuration in
  ``KILO_CONFIG_CONTENT``; ``run --model ollapy/M``.
* Crush (``crush``, npm ``@charmland/crush``): an ``openai-compat`` provider ``ollapy`` in
  ``$XDG_CONFIG_HOME/crush/crush.json`` (``context_window``, ``default_max_tokens``), chosen as its large and small
  model.

A file an agent reads is changed by a :class:`ConfigEdit`: a JSON merge that keeps everything else in it (a
list of objects is merged by ``id``), written atomically; a file that is not a JSON object is never overwritten.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ollapy import config
from ollapy.errors import OllapyError

#: install commands of the agents this module builds plans for
AGENTS = {
    "pi": "npm install -g @mariozechner/pi-coding-agent", "qwen": "npm install -g @qwen-code/qwen-code",
    "droid": "npm install -g @factory/cli", "cline": "npm install -g cline", "kilo": "npm install -g @kilocode/cli",
    "crush": "npm install -g @charmland/crush",
}
PROVIDER = "ollapy"
"""The provider name ollapy's entries take in an agent's configuration."""


def merge_json(base: Any, patch: Any) -> Any:
    """``patch`` merged into ``base`` (neither changed): objects key by key, recursively; a list of objects that all
    have an ``id`` replaces the entries of ``base`` with the same ``id`` in place and appends the rest; any other
    value replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge_json(base[k], v) if k in base else v
        return out
    if _id_list(base) and _id_list(patch):
        new = {p["id"]: p for p in patch}
        out = [merge_json(e, new.pop(e["id"])) if e["id"] in new else e for e in base]
        return out + [p for p in patch if p["id"] in new]
    return patch


def _id_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(e, dict) and "id" in e for e in v)


@dataclass
class ConfigEdit:
    """``patch`` merged (:func:`merge_json`) into the JSON object in the file at ``path`` before the agent starts."""

    path: str
    patch: dict

    def apply(self) -> None:
        """Merge and write atomically (a file that does not exist starts as ``{}``). Raises OllapyError when the
        file is not a JSON object (it is left as it is)."""
        from ollapy.fsutil import write_atomically

        p = Path(self.path)
        current: Any = {}
        if p.exists():
            try:
                current = json.loads(p.read_text() or "{}")
            except (ValueError, UnicodeDecodeError):
                current = None
            if not isinstance(current, dict):
                raise OllapyError(f"{p} is not a JSON object; not changing it",
                                  hint="fix or move the file, or run launch with --config and set it up by hand")
        p.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(merge_json(current, self.patch), indent=2) + "\n").encode()
        write_atomically(p, lambda f: f.write(data))

    def describe(self) -> str:
        """The edit as a shell comment line: ``# merge into PATH: JSON``."""
        return f"# merge into {self.path}: {json.dumps(self.patch, separators=(',', ':'))}"


def _home(env: dict) -> Path:
    return Path(env.get("HOME") or Path.home())


def _key(key: str | None) -> str:
    return key or PROVIDER


def _pi(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, output_bound

    agent_dir = env.get("PI_CODING_AGENT_DIR") or str(_home(env) / ".pi" / "agent")
    provider = {"baseUrl": url + "/v1", "api": "openai-completions", "apiKey": _key(key),
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [{"id": model, "name": model, "input": ["text"], "contextWindow": context,
                            "maxTokens": output_bound(context)}]}
    edit = ConfigEdit(str(Path(agent_dir) / "models.json"), {"providers": {PROVIDER: provider}})
    return LaunchPlan([exe, "--provider", PROVIDER, "--model", model, *args], edits=[edit])


def qwen_defaults_path() -> Path:
    """The settings file ollapy gives Qwen Code as its system defaults (``QWEN_CODE_SYSTEM_DEFAULTS_PATH``)."""
    return config.state_dir() / "qwen" / "system-defaults.json"


def _qwen(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, _bounded, output_bound

    path = str(qwen_defaults_path())
    s = {"OPENAI_BASE_URL": url + "/v1", "OPENAI_API_KEY": _key(key), "OPENAI_MODEL": model,
         "QWEN_CODE_MAX_OUTPUT_TOKENS": _bounded(env, "QWEN_CODE_MAX_OUTPUT_TOKENS", output_bound(context)),
         "QWEN_CODE_SYSTEM_DEFAULTS_PATH": path}
    # managed auto-memory off: after every prompt Qwen Code 0.15 sends a second request of its own (a 7k-token
    # memory extraction, a cold prefill on a local model) and `-p` waits for it before it prints the answer
    edit = ConfigEdit(path, {"model": {"generationConfig": {"contextWindowSize": context}},
                             "memory": {"enableManagedAutoMemory": False}})
    return LaunchPlan([exe, "--auth-type", "openai", "-m", model, *args], s, edits=[edit])


def droid_model_id(model: str) -> str:
    """Droid's id of ollapy's custom model (``custom:`` marks a custom model in Droid's model picker)."""
    return f"custom:{PROVIDER}-{model}"


def droid_settings_path() -> Path:
    """The runtime settings file ollapy gives Droid (``--settings``: merged over the user's own for one run)."""
    return config.state_dir() / "droid" / "settings.json"


def _droid(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, output_bound

    mid = droid_model_id(model)
    entry = {"id": mid, "model": model, "displayName": f"{model} (ollapy)", "baseUrl": url + "/v1",
             "apiKey": _key(key), "provider": "generic-chat-completion-api", "maxOutputTokens": output_bound(context),
             "supportsImages": False}
    path = str(droid_settings_path())
    edit = ConfigEdit(path, {"customModels": [entry], "sessionDefaultSettings": {"model": mid}})
    if args and args[0] == "exec":
        return LaunchPlan([exe, "exec", "--settings", path, "-m", mid, *args[1:]], edits=[edit])
    return LaunchPlan([exe, "--settings", path, *args], edits=[edit])


def js_timestamp() -> str:
    """Now as JavaScript's ``Date.toISOString()`` writes it (UTC, milliseconds, ``Z``): the form zod's
    ``datetime()`` accepts."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _cline(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, output_bound

    settings = {"provider": "openai-compatible", "apiKey": _key(key), "model": model, "baseUrl": url + "/v1",
                "contextWindow": context, "maxTokens": output_bound(context)}
    # updatedAt is required: Cline 3.0 reads a file with an entry lacking it as no file, and writes its own
    # default (its `cline` provider) over it
    entry = {"settings": settings, "updatedAt": js_timestamp(), "tokenSource": "manual"}
    edit = ConfigEdit(str(_home(env) / ".cline" / "data" / "settings" / "providers.json"),
                      {"version": 1, "lastUsedProvider": "openai-compatible", "providers": {"openai-compatible": entry}})
    # no -P/-m: Cline 3.0 then saves the provider as {provider, model} alone, dropping the base URL and key it has
    return LaunchPlan([exe, *args], edits=[edit])


def _kilo(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, opencode_config

    cfg = opencode_config(url, model, context, key)
    cfg.pop("$schema")  # opencode's schema; Kilo has its own
    s = {"KILO_CONFIG_CONTENT": json.dumps(cfg, separators=(",", ":"))}
    if args and args[0] == "run":
        return LaunchPlan([exe, "run", "--model", f"{PROVIDER}/{model}", *args[1:]], s)
    return LaunchPlan([exe, *args], s)


def _crush(exe: str, url: str, model: str, context: int, args: list[str], env: dict, key: str | None):
    from ollapy.cli.launch_cmd import LaunchPlan, output_bound

    provider = {"name": "ollapy", "type": "openai-compat", "base_url": url + "/v1", "api_key": _key(key),
                "models": [{"id": model, "name": model, "context_window": context,
                            "default_max_tokens": output_bound(context)}]}
    chosen = {"model": model, "provider": PROVIDER}
    xdg = env.get("XDG_CONFIG_HOME") or str(_home(env) / ".config")
    edit = ConfigEdit(str(Path(xdg) / "crush" / "crush.json"),
                      {"providers": {PROVIDER: provider}, "models": {"large": chosen, "small": chosen}})
    return LaunchPlan([exe, *args], edits=[edit])


BUILDERS = {"pi": _pi, "qwen": _qwen, "droid": _droid, "cline": _cline, "kilo": _kilo, "crush": _crush}
"""Plan builders by agent name: ``(exe, url, model, context, args, env, key) -> LaunchPlan``."""

assert set(BUILDERS) == set(AGENTS)
