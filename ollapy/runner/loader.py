"""The one place that turns a model name into a loaded model with its prompt cache.

Used by every caller that loads models: the CLI's ``run`` (one-shot, piped,
REPL, ``--each-line``), ``cache warm``, and the server's runtime. Nothing here
imports llama_cpp at module level.

* :func:`resolve` maps a name to a reference: store names (manifests, the
  catalogue, an Ollama store) and, only where the caller allows it, an
  ABSOLUTE path to a ``.gguf`` file. There is no working-directory guessing
  here: the CLI turns the user's relative path into an absolute one itself
  (``absolute_model_arg`` in the CLI's runner module), a server allows paths
  only with ``serve --allow-paths``.
* :func:`base_options`: defaults from the ``OLLAPY_*`` settings < the model's
  parameters < the caller's overrides.
* :func:`open_model`: a :class:`~ollapy.engine.interface.ModelRunner`, in this process or in a runner child;
  :func:`open_local` builds the in-process one (a :class:`~ollapy.engine.model.LoadedModel` wired to its
  prompt cache). Close it (or use it as a context manager): that stops the engine, drains the cache writer,
  frees the model.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ollapy import config
from ollapy.engine.interface import ModelRunner
from ollapy.errors import ModelNotFound, PathNotAllowed
from ollapy.options import Options

if TYPE_CHECKING:
    from ollapy.store.resolve import ModelRef

log = logging.getLogger("ollapy.runner.loader")


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
    projector: Path | None = None  # a vision projector GGUF (none for a bare path)
    adapters: list = field(default_factory=list)  # LoRA adapter GGUFs (Modelfile ADAPTER; none for a bare path)


def is_path_name(name: str) -> bool:
    """True when ``name`` is an absolute filesystem path (``~`` expanded)."""
    return os.path.isabs(os.path.expanduser(name))


def is_path_like(name: str) -> bool:
    """True when ``name`` is written as a file path rather than a store name, judged by its text alone.

    Absolute or ``~`` paths, ``./`` and ``../`` prefixes, backslashes, and
    ``*.gguf`` without a ``:tag``. Never looks at the filesystem, so the
    answer (and any error built on it) cannot reveal whether a file exists.
    """
    text = name.strip()
    if is_path_name(text) or text.startswith(("./", "../", "~", ".\\")) or text in (".", "..") or "\\" in text:
        return True
    return text.lower().endswith(".gguf") and ":" not in text


PATHS_REFUSED = "model paths are not accepted here"
PATHS_REFUSED_HINT = "use a model name from `ollapy list`, or start the server with `ollapy serve --allow-paths`"


def resolve(name: str, *, pull: bool = False, allow_paths: bool = False):
    """Resolve a model name to a reference with ``.path``, ``.system``, ``.parameters``...

    An absolute path is a :class:`PathRef` when ``allow_paths``; without it,
    anything written as a path (:func:`is_path_like`, relative ones too) is
    refused with PathNotAllowed, the same words whether or not the file
    exists (a server must not reveal which files exist). Store names go
    through :func:`ollapy.store.resolve_model` (pulling when ``pull``).
    Raises ModelNotFound when nothing matches.
    """
    if not allow_paths and is_path_like(name):
        raise PathNotAllowed(PATHS_REFUSED, hint=PATHS_REFUSED_HINT)
    if is_path_name(name):
        p = Path(os.path.expanduser(name))
        return PathRef(name=p.name, path=p)
    try:
        from ollapy.store import resolve_model
    except ImportError:  # pragma: no cover - the store is part of the package
        raise ModelNotFound(f"model {name!r} not found", hint="pass an absolute path to a .gguf file") from None
    return resolve_model(name, pull=pull)


def base_options(ref, overrides: dict | None = None, *, defaults: dict | None = None) -> Options:
    """Defaults (from OLLAPY_* settings) < ``defaults`` (a server's ``serve -o``) < the model's parameters <
    ``overrides``; raises OptionError."""
    base = Options(num_ctx=config.num_ctx(), num_parallel=config.num_parallel(), num_thread=config.num_thread(),
                   extra_bufts=config.extra_bufts(), kv_cache_type=config.kv_cache_type(), rpc=config.rpc())
    return base.merged(defaults or {}).merged(dict(getattr(ref, "parameters", None) or {})).merged(overrides or {})


def open_model(ref, options: Options, *, cache: bool = True, write_back: bool = False, max_queue: int | None = None,
               isolated: bool | None = None) -> ModelRunner:
    """Load ``ref`` with ``options`` and its prompt cache; returns an open :class:`ModelRunner`.

    The factory only chooses where the model runs. ``isolated`` True: in a runner child process
    (:class:`ollapy.runner.process.ProcessModel`, which builds it there with :func:`open_local`); False: in this
    process (:func:`open_local`); None: isolated when ``OLLAPY_RUNNER=process``, or when ``options.rpc`` is set
    (llama.cpp's RPC client aborts the process that loses a server).

    ``cache`` False loads without a prompt cache; ``write_back`` True (one CLI
    process per answer) writes RAM-only cache entries to disk when the model
    is closed. Raises ModelLoadError for files llama.cpp rejects, RunnerError
    when a runner child dies while loading.
    """
    max_queue = config.max_queue() if max_queue is None else max_queue
    if isolated is None:
        isolated = config.runner() == "process" or bool(options.rpc)
    if isolated:
        from ollapy.runner.process import ProcessModel

        return ProcessModel(ref, options, cache=cache, write_back=write_back, max_queue=max_queue)
    return open_local(ref, options, cache=cache, write_back=write_back, max_queue=max_queue)


def open_local(ref, options: Options, *, cache: bool = True, write_back: bool = False, max_queue: int = 512):
    """Build the model in THIS process: its prompt cache, then a :class:`~ollapy.engine.model.LoadedModel` bound
    to it. Used by :func:`open_model` and by a runner child (never the other way round).

    A cache that cannot be opened is logged and skipped: serving never depends on it. Raises ModelLoadError.
    """
    from ollapy.engine.model import LoadedModel

    prompt_cache = None
    if cache:
        try:
            from ollapy.cache import open_prompt_cache

            prompt_cache = open_prompt_cache(ref, options, write_back=write_back)
        except Exception:  # noqa: BLE001 - a cache that cannot open never stops a model from loading
            log.exception("prompt cache unavailable for %s", getattr(ref, "name", ref))
    return LoadedModel(ref.path, options, name=ref.name, template=getattr(ref, "template", None), cache=prompt_cache,
                       max_queue=max_queue, digest=getattr(ref, "digest", None), draft_path=draft_path(options),
                       projector_path=getattr(ref, "projector", None), adapter_paths=getattr(ref, "adapters", None) or ())


def draft_path(options: Options) -> Path | None:
    """The GGUF file of the draft model that ``options.draft`` names, or None for no draft model (``""``,
    ``ngram``): store.resolve.resolve_draft. Raises ModelNotFound."""
    from ollapy.store.resolve import resolve_draft

    return resolve_draft(options.draft)


def checked_draft_path(ref: PathRef | ModelRef, options: Options) -> Path | None:
    """:func:`draft_path`, then the vocabulary check on the two GGUF headers
    (:func:`ollapy.store.draft_vocab.check_draft_header`: llama.cpp's whole rule, token texts included) before
    anything loads: a server checks a request's draft model with it before it unloads the model it serves.
    Reads both token arrays (a cost linear in the vocabulary size). Raises ModelNotFound, DraftMismatch,
    ModelLoadError (an unreadable header)."""
    path = draft_path(options)
    if path is not None:
        from ollapy.store.draft_vocab import check_draft_header

        check_draft_header(ref.path, path, ref.name, options.draft)
    return path


def close_all(timeout: float = 120.0) -> int:
    """The process-wide shutdown step: drain every prompt-cache writer that still has work.

    Each model closes its own cache; this catches writers whose owner was
    never closed. Returns how many states were not saved. Called by the CLI's
    entry point and the server's shutdown, in that one place each.
    """
    from ollapy.cache.writer import drain_all

    return drain_all(timeout).unsaved
