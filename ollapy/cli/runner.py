"""What ``run`` talks to when no server answers: a model loaded in this process.

Name resolution and model loading live in :mod:`ollapy.loader` (shared with
the server); this module adds what only a terminal user needs: a model path
relative to the working directory, and the one-line report of prompt-cache
states that could not be saved when the process ends early.
"""
from __future__ import annotations

import os

from .. import loader
from ..options import Options
from .output import warn


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


def resolve_for_cli(name: str, pull: bool = True):
    """Resolve a model argument as typed in a terminal (paths allowed, relative ones from the working dir)."""
    return loader.resolve(absolute_model_arg(name), pull=pull, allow_paths=True)


class EmbeddedRunner:
    """Runs a model in this process. ``chat`` returns an engine Request (iterable of chunks, ``cancel()``).

    A context manager; :meth:`close` stops the engine, saves the prompt
    cache (RAM-only entries are written back: the next ``ollapy run`` is a
    new process) and frees the model.
    """

    def __init__(self, ref, options: Options, cache: bool = True) -> None:
        self.options = options
        self.model = loader.open_model(ref, options, cache=cache, write_back=True)

    def __enter__(self) -> EmbeddedRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def num_ctx(self) -> int:
        """Context length per slot."""
        return self.model.backend.num_ctx

    def chat(self, messages: list[dict], cli_options: dict, fmt=None, cache: bool = True):
        """Submit a chat; returns the engine Request."""
        return self.model.chat(messages, self.options, fmt=fmt, cache=cache)

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


def connect_runner(name: str, cli_options: dict, settings, pull: bool = True):
    """Return ``(runner, ref)``: a server-backed runner when a server answers at OLLAPY_HOST, else in-process.

    A model given as a file path always loads in this process (a server resolves only its store's names).
    """
    try:
        from .remote import probe_server
    except ImportError:
        probe_server = None
    arg = absolute_model_arg(name)
    if probe_server is not None and not loader.is_path_name(arg):  # a file on this machine loads here
        remote = probe_server(arg, cli_options, settings)
        if remote is not None:
            return remote
    ref = loader.resolve(arg, pull=pull, allow_paths=True)
    options = loader.base_options(ref, cli_options)
    return EmbeddedRunner(ref, options, cache=getattr(settings, "cache", True)), ref
