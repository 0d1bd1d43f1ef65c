"""What ``run`` talks to: a model loaded in this process, or a running ``ollapy serve``.

:func:`load_model_for_run` resolves the name (pulling when allowed), then
returns a :class:`Conversation` whose ``ask`` streams chunks. The
conversation keeps the chat history (so each REPL turn reuses the KV of
earlier turns) and, with ``--session NAME``, saves it (with its options) to
the state dir so a new process can continue it. The REPL's ``/save NAME``
makes a model in the store instead (:meth:`Conversation.save_model`), as
Ollama does, and ``/load NAME`` switches to a model (:meth:`Conversation.switch_model`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ollapy import config
from ollapy.errors import OllapyError, OptionError, UsageError
from ollapy.fsutil import write_atomically


@dataclass
class RunSettings:
    """Per-run CLI settings (not model options)."""

    system: str | None = None
    fmt: object = None
    verbose: bool = False
    wrap: bool = True
    cache: bool = True
    session: str | None = None
    markdown: bool = False
    keepalive: str | None = None
    history: bool = True
    think: bool | str | None = None  # None: the model's default (on for a thinking model, as in Ollama)
    hidethinking: bool = False  # compute the reasoning but do not print it
    local: bool = False  # `run --local`: load the model in this process even when a server answers
    parallel: int | None = None  # `run --parallel N` as given (None: not given)


class CapabilityError(OllapyError):
    """The model cannot do what was asked (``--think`` on a model without thinking). Exit 1, as Ollama."""


_SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def session_path(name: str) -> Path:
    """File of a named session; raises UsageError for names that are not simple words."""
    if not _SESSION_NAME.match(name):
        raise UsageError(f"invalid session name {name!r}", hint="use letters, digits, '.', '_' or '-' (max 64)")
    return config.state_dir() / "sessions" / f"{name}.json"


def load_session(name: str) -> dict | None:
    """Saved session dict (model, system, options, messages) or None when absent or unreadable."""
    p = session_path(name)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def save_session(name: str, data: dict) -> Path:
    """Write a session atomically (temp file + rename); returns its path."""
    p = session_path(name)
    write_atomically(p, lambda f: f.write(json.dumps(data, ensure_ascii=False, indent=1).encode()), suffix=".json")
    return p


@dataclass
class Conversation:
    """A model plus the chat so far. ``runner`` is an in-process runner or a server client.

    A context manager: leaving the ``with`` block closes the runner (for an
    in-process model: engine stopped, prompt cache saved, model freed).
    """

    runner: object
    name: str
    system: str | None
    options: dict
    messages: list[dict] = field(default_factory=list)
    session: str | None = None
    base: str | None = None  # what a saved model's FROM line names: the store name, or the GGUF's absolute path
    license: str | None = None  # the model's LICENSE (what `ollapy show --license` prints)

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the runner (idempotent)."""
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()

    @property
    def num_ctx(self) -> int:
        """Context length per slot of the loaded model."""
        return self.runner.num_ctx

    @property
    def on_server(self) -> bool:
        """True when the model runs on a ``ollapy serve`` (not in this process)."""
        from ollapy.cli.remote import RemoteRunner

        return isinstance(self.runner, RemoteRunner)

    def reload(self, updates: dict, settings: RunSettings) -> None:
        """Load the same model again with ``updates`` (load-time options such as ``num_ctx``) merged into this
        run's options; history, system prompt and the other options stay. On a server the next load asks it
        to reload; a server-only option (``rpc``) moves the model into this process (and says so). When the
        load fails, the model is loaded again as it was and the error is raised (the options stay unchanged)."""
        from ollapy.cli.embedded import connect_runner

        new_options = {**self.options, **updates}
        name = self.base or self.name
        if not self.on_server:  # a draft model that cannot serve is refused before the loaded model is closed
            self._check_draft(name, new_options)
        self.close()
        try:
            self.runner, _ = connect_runner(name, new_options, settings, pull=False)
        except Exception:
            self.runner, _ = connect_runner(name, self.options, settings, pull=False)
            raise
        self.options = new_options

    @staticmethod
    def _check_draft(name: str, options: dict) -> None:
        """Raise ModelNotFound or DraftMismatch when ``options`` name a draft model that is missing or of another
        vocabulary than the model ``name`` (loader.checked_draft_path: the GGUF headers, nothing loads)."""
        from ollapy.cli.embedded import resolve_for_cli
        from ollapy.options import Options, draft_model
        from ollapy.runner import loader

        draft = options.get("draft")
        if isinstance(draft, str) and draft_model(draft):
            loader.checked_draft_path(resolve_for_cli(name, pull=False), Options().merged({"draft": draft}))

    def chat_messages(self, text: str | None, system: str | None, images: list[str] | None = None) -> list[dict]:
        """Messages to send: system, history, then the new user text (with ``images``, base64 strings)."""
        msgs: list[dict] = []
        sys_text = system if system is not None else self.system
        if sys_text:
            msgs.append({"role": "system", "content": sys_text})
        msgs.extend(m for m in self.messages if m["role"] != "system")
        if text is not None:
            msgs.append({"role": "user", "content": text, **({"images": list(images)} if images else {})})
        return msgs

    @property
    def capabilities(self) -> list[str]:
        """Ollama's capabilities of the model (``completion``, ``tools``, ``thinking``, ``embedding``)."""
        return list(getattr(self.runner, "capabilities", None) or ["completion"])

    def check_think(self, think: bool | str | None) -> None:
        """Raise CapabilityError (exit 1) with Ollama's words when ``think`` asks a model without thinking to think."""
        from ollapy.chat.reply import check_capabilities

        try:
            check_capabilities(getattr(self.runner, "name", self.name), can_think="thinking" in self.capabilities, think=think)
        except OptionError as exc:
            raise CapabilityError(exc.message) from None

    def ask(self, text: str | None, settings: RunSettings, images: list[str] | None = None):
        """Start streaming the answer to ``text`` (with ``images``: base64 strings, for a vision model); returns
        an iterable of chunks with ``cancel()``.

        Chunks have ``text`` (answer) and ``thinking`` (reasoning, with ``settings.think``)."""
        if images and text is None:
            text = ""
        msgs = self.chat_messages(text, settings.system, images)
        self._pending_user = text
        self._pending_images = list(images or [])
        self._reply: list[str] = []
        self._thinking: list[str] = []
        stream = self.runner.chat(msgs, self.options, fmt=settings.fmt, cache=settings.cache, think=settings.think)
        return _Recording(stream, self._reply, self._thinking)

    def after_answer(self, final, settings: RunSettings) -> None:
        """Record the finished turn in the history and save the named session, if any."""
        if final is None or self._pending_user is None:
            return
        user = {"role": "user", "content": self._pending_user}
        if getattr(self, "_pending_images", None):  # the images stay with their turn, as in Ollama's CLI
            user["images"] = self._pending_images
        self.messages.append(user)
        answer = {"role": "assistant", "content": "".join(self._reply)}
        if "".join(self._thinking):  # kept with the turn, as Ollama's CLI does (templates decide whether to render it)
            answer["thinking"] = "".join(self._thinking)
        self.messages.append(answer)
        if self.session:
            self.save(self.session, settings)

    def save(self, name: str, settings: RunSettings) -> Path:
        """Persist this conversation under ``name``."""
        return save_session(name, {
            "model": self.name,
            "system": settings.system if settings.system is not None else self.system,
            "options": {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()},
            "messages": self.messages,
        })

    def save_model(self, name: str, settings: RunSettings) -> str:
        """Create model ``name`` in the store (Ollama's ``/save``): FROM the current model, with the current
        system prompt, the options (``-o`` and ``/set parameter``) as PARAMETERs and the chat so far as
        MESSAGEs. Goes through the store's ``create_model``; returns the stored name. Raises UsageError
        (bad name), ModelNotFound."""
        from ollapy.options import coerce_option
        from ollapy.store import create_model
        from ollapy.store.modelfile import Modelfile

        system = settings.system if settings.system is not None else self.system
        params = {k: list(coerce_option(k, v)) if k == "stop" else coerce_option(k, v) for k, v in self.options.items()}
        msgs = [{"role": m["role"], "content": m.get("content", "")} for m in self.messages if m["role"] != "system"]
        spec = Modelfile(from_=str(self.base or self.name), parameters=params, system=system or None, messages=msgs)
        return create_model(name, spec, Path.cwd(), quiet=True).name  # the values as they are: no Modelfile text

    def switch_model(self, name: str, settings: RunSettings) -> None:
        """Unload the current model and load ``name`` (Ollama's ``/load``): its system prompt and messages
        replace the current ones; options given with ``-o`` or ``/set parameter`` stay. Raises ModelNotFound
        (the current model stays loaded) or the load error (the previous model is loaded again first)."""
        from ollapy.cli.embedded import absolute_model_arg, connect_runner, resolve_for_cli
        from ollapy.runner import loader

        resolve_for_cli(name, pull=False)  # an unknown name fails here, before anything is unloaded
        old_name = self.base or self.name
        self.close()
        try:
            runner, ref = connect_runner(name, self.options, settings, pull=False)
        except Exception:
            self.runner, _ = connect_runner(old_name, self.options, settings, pull=False)
            raise
        arg = absolute_model_arg(name)
        self.runner, self.name = runner, ref.name
        self.base = arg if loader.is_path_name(arg) else ref.name
        self.system = ref.system
        self.license = getattr(ref, "license", None)
        self.messages = list(ref.messages or [])
        settings.system = None

    def clear(self) -> None:
        """Forget the chat history (the system prompt stays)."""
        self.messages = []


class _Recording:
    """Wraps a chunk stream, collecting the answer and the reasoning for the history."""

    def __init__(self, stream, sink: list[str], thinking: list[str] | None = None) -> None:
        self.stream = stream
        self.sink = sink
        self.thinking = thinking if thinking is not None else []

    def __iter__(self):
        for c in self.stream:
            self.sink.append(c.text)
            self.thinking.append(getattr(c, "thinking", "") or "")
            yield c

    def cancel(self) -> None:
        self.stream.cancel()


def load_model_for_run(name: str, cli_options: dict, settings: RunSettings, pull: bool = True) -> Conversation:
    """Resolve ``name`` and return a ready Conversation (through a server when one answers, else in-process).

    With ``settings.session`` naming a saved session, its messages, system prompt and options come back;
    options in ``cli_options`` (``-o``) win over saved ones.
    """
    from ollapy.cli.embedded import absolute_model_arg, connect_runner
    from ollapy.runner import loader

    data = load_session(settings.session) if settings.session else None
    options = dict(cli_options)
    if data:
        options = {**_saved_options(data.get("options")), **cli_options}
    runner, ref = connect_runner(name, options, settings, pull=pull)
    arg = absolute_model_arg(name)
    conv = Conversation(runner=runner, name=ref.name, system=ref.system, options=options,
                        messages=list(ref.messages or []), session=settings.session,
                        base=arg if loader.is_path_name(arg) else ref.name, license=getattr(ref, "license", None))
    if settings.think is not None:
        try:
            conv.check_think(settings.think)
        except CapabilityError:
            conv.close()
            raise
    if data:  # (nothing below can fail: the runner is closed by the caller's `with`)
        conv.messages = list(data.get("messages", []))
        if settings.system is None and data.get("system"):
            conv.system = data["system"]
    return conv


def _saved_options(saved) -> dict:
    """A saved session's options, typed again; a value that no longer parses (hand-edited file) is dropped."""
    from ollapy.errors import OptionError
    from ollapy.options import coerce_option

    out = {}
    for k, v in (saved or {}).items() if isinstance(saved, dict) else ():
        try:
            out[k] = coerce_option(k, v)
        except OptionError:
            continue
    return out
