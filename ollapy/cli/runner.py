"""Model resolution and the in-process runner used by ``run`` when no server answers.

The in-process runner loads the model with :class:`ollapy.engine.model.LoadedModel`
(imported lazily: ``--help``, ``list`` and ``ps`` never load llama.cpp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from ..errors import ModelNotFound
from ..options import Options


@dataclass
class PathRef:
    """A model given as a path to a GGUF file (no store entry)."""

    name: str
    path: Path
    digest: str | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict = field(default_factory=dict)
    messages: list = field(default_factory=list)
    license: str | None = None


def resolve(name: str, pull: bool = True):
    """Resolve a model name or path to a reference with ``.path``, ``.system``, ``.parameters``...

    Uses the model store when it is installed; a path to an existing file
    always works. Raises ModelNotFound otherwise.
    """
    p = Path(name).expanduser()
    if p.exists() or name.endswith(".gguf") or "/" in name and name.startswith((".", "/", "~")):
        return PathRef(name=p.name, path=p)
    try:
        from ..store import resolve_model
    except ImportError:
        raise ModelNotFound(f"model {name!r} not found", hint="pass a path to a .gguf file") from None
    return resolve_model(name, pull=pull)


def base_options(ref, cli_options: dict) -> Options:
    """Defaults (from OLLAPY_* settings) < the model's parameters < command-line ``-o`` options."""
    base = Options(num_ctx=config.num_ctx(), num_parallel=config.num_parallel(), num_thread=config.num_thread(),
                   extra_bufts=config.extra_bufts(), kv_cache_type=config.kv_cache_type())
    return base.merged(dict(ref.parameters or {})).merged(cli_options)


class EmbeddedRunner:
    """Runs a model in this process. ``chat`` returns an engine Request (iterable of chunks, ``cancel()``)."""

    def __init__(self, ref, options: Options) -> None:
        from ..engine.model import LoadedModel

        cache = None
        try:
            from ..cache import open_prompt_cache

            cache = open_prompt_cache(ref, options)
        except ImportError:
            cache = None
        self.options = options
        self.model = LoadedModel(ref.path, options, name=ref.name, template=ref.template, cache=cache,
                                 digest=getattr(ref, "digest", None))

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
        """Unload the model."""
        self.model.close()


def connect_runner(name: str, cli_options: dict, settings, pull: bool = True):
    """Return ``(runner, ref)``: a server-backed runner when a server answers at OLLAPY_HOST, else in-process."""
    try:
        from .remote import probe_server
    except ImportError:
        probe_server = None
    if probe_server is not None:
        remote = probe_server(name, cli_options, settings)
        if remote is not None:
            return remote
    ref = resolve(name, pull=pull)
    options = base_options(ref, cli_options)
    return EmbeddedRunner(ref, options), ref
