"""What ``run`` talks to when no server answers: a model loaded in this process.

Name resolution and model loading live in :mod:`ollapy.runner.loader` (shared with
the server); this module adds what only a terminal user needs: a model path
relative to the working directory, and the one-line report of prompt-cache
states that could not be saved when the process ends early.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

from ollapy.cli.output import info, warn
from ollapy.options import Options
from ollapy.runner import loader


def absolute_model_arg(name: str) -> str:
    """The user's model argument, with a path made absolute (relative to the working directory).

    A path is an argument that names an existing file, ends in ``.gguf``, or
    starts with ``./``, ``../``, ``~`` or ``/``; anything else is a model name.
    """
    expanded = os.path.expanduser(name)
    if (name.startswith(("./", "../", "~", "/")) or name.endswith(".gguf") or os.path.isfile(expanded)) \
            and ":" not in name.split("/")[0]:
        return os.path.abspath(expanded)
    return name


def absolute_draft_option(options: dict) -> dict:
    """``options`` with a ``draft`` that names a GGUF path made absolute (:func:`absolute_model_arg`'s rule), so
    that a server, whose working directory is not the user's, finds the file the user meant."""
    from ollapy.options import draft_model

    draft = options.get("draft")
    if isinstance(draft, str) and draft_model(draft):
        return {**options, "draft": absolute_model_arg(draft)}
    return options


def resolve_for_cli(name: str, pull: bool = True):
    """Resolve a model argument as typed in a terminal (paths allowed, relative ones from the working dir)."""
    return loader.resolve(absolute_model_arg(name), pull=pull, allow_paths=True)


class EmbeddedRunner:
    """Runs a model in this process. ``chat`` returns an engine Request (iterable of chunks, ``cancel()``).

    A context manager; :meth:`close` stops the engine, saves the prompt
    cache (RAM-only entries are written back: the next ``ollapy run`` is a
    new process) and frees the model.
    """

    def __init__(self, ref, options: Options, cache: bool = True, name: str | None = None) -> None:
        self.options = options
        self.name = name or ref.name  # the model as the user named it (error messages)
        self.model = loader.open_model(ref, options, cache=cache, write_back=True)

    def __enter__(self) -> EmbeddedRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def num_ctx(self) -> int:
        """Context length per slot."""
        return self.model.facts.num_ctx

    @property
    def capabilities(self) -> list[str]:
        """Ollama's capabilities of the loaded model (``completion``/``embedding``, ``tools``, ``thinking``)."""
        from ollapy.chat.reply import model_capabilities

        return model_capabilities(self.model.template.text, embedding_only=self.model.embedding_only)

    def chat(self, messages: list[dict], cli_options: dict, fmt=None, cache: bool = True, think=None):
        """Submit a chat; returns a :class:`SplitStream` over the engine Request (chunks with ``thinking``).

        ``think`` (validated, None: the model's default) is checked as the server checks it
        (:func:`ollapy.chat.reply.check_capabilities`: OptionError on a model without thinking).
        """
        from ollapy.chat.reply import ReplyParser, check_capabilities
        from ollapy.chat.thinking import prompt_opens_thinking, think_enabled

        model = self.model
        think = check_capabilities(self.name, can_think=model.supports_thinking, think=think)
        prompt = model.chat_prompt(messages, self.options, think=think)
        parser = ReplyParser(think=think_enabled(think), opened=prompt_opens_thinking(prompt.text))
        return SplitStream(model.submit(prompt, self.options, fmt=fmt, cache=cache), parser)

    def info(self) -> dict:
        """Facts about the loaded model (see LoadedModel.info)."""
        return self.model.info()

    def close(self) -> None:
        """Unload the model; prints one line when prompt-cache states could not be saved (Ctrl-C, timeout)."""
        try:
            self.model.close()
        finally:
            n = self.model.unsaved_states
            if n:
                warn(f"prompt cache: {n} state{'s' if n != 1 else ''} not saved")


class SplitStream:
    """Engine chunks with the answer split by a :class:`~ollapy.chat.reply.ReplyParser`: each chunk has ``text``
    (answer), ``thinking`` (reasoning), ``done``, ``done_reason``, ``metrics``; ``cancel()`` cancels."""

    def __init__(self, request, parser) -> None:
        self.request = request
        self.parser = parser

    def __iter__(self):
        for c in self.request:
            delta = self.parser.feed(c.text) if c.text else self.parser.feed("")
            if c.done:
                delta = delta + self.parser.finish()
            yield SimpleNamespace(text=delta.content, thinking=delta.thinking, done=c.done,
                                  done_reason=getattr(c, "done_reason", None), metrics=getattr(c, "metrics", None))

    def cancel(self) -> None:
        self.request.cancel()


def connect_runner(name: str, cli_options: dict, settings, pull: bool = True):
    """Return ``(runner, ref)``: a server-backed runner when a server answers at OLLAPY_HOST, else in-process.

    A missing model is pulled when ``pull``: by the server into its store when the model runs there, else into
    the local store.

    Three cases load in this process even with a server running: a model given as a file path (a server
    resolves only its store's names), ``run --local`` (``settings.local``), and options a request may not
    set (:data:`ollapy.options.SERVER_ONLY_OPTIONS`, e.g. ``rpc``: the server's operator sets those); the
    last one says so on stderr when a server is listening.
    """
    from ollapy.options import SERVER_ONLY_OPTIONS

    try:
        from ollapy.cli.remote import port_open, probe_server
    except ImportError:
        probe_server = port_open = None
    arg = absolute_model_arg(name)
    own = sorted(k for k in cli_options if k in SERVER_ONLY_OPTIONS)
    use_server = probe_server is not None and not loader.is_path_name(arg) and not getattr(settings, "local", False)
    if use_server and own:
        use_server = False
        if port_open():
            from ollapy import config

            shown = ", ".join(f"-o {k}" for k in own)
            info(f"{shown} is set by a server's operator, not by its clients: loading {name} in this process, "
                 f"not on the server at {config.host()} (--local does this for any run)")
    if use_server:
        remote = probe_server(arg, cli_options, settings, pull=pull)
        if remote is not None:
            return remote
    ref = loader.resolve(arg, pull=pull, allow_paths=True)
    options = loader.base_options(ref, cli_options)
    return EmbeddedRunner(ref, options, cache=getattr(settings, "cache", True), name=name), ref
