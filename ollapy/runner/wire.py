"""What a runner child and its parent exchange, besides engine objects.

Messages are tuples pickled over a :class:`multiprocessing.connection.Connection`
on an inherited socketpair. Parent to child:

* ``("load", spec)`` first, ``spec`` from :func:`load_spec`;
* ``("call", id, op, args, kwargs)``, ``op`` one of :data:`CALLS`;
* ``("submit", id, prompt, options, kwargs)``: a generation (``prompt`` an
  :class:`ollapy.engine.request.Prompt`);
* ``("cancel", id)``: cancel that generation; ``("finish", id)``: end it as finished (its final chunk and
  metrics still come: ``Request.finish_early``);
* ``("close", id, timeout_s)``: close the model, answer, exit 0.

Child to parent:

* ``("ready", facts)`` (:class:`ReadyFacts`) or ``("failed", error)``;
* ``("status", 0, snapshot)`` every :data:`STATUS_INTERVAL_S` seconds: the child's
  :class:`~ollapy.engine.interface.RunnerSnapshot` (engine and prompt-cache figures), which the parent's
  ``/api/ps`` and ``/metrics`` read without a round trip;
* ``("result", id, value)`` / ``("error", id, error)`` for calls, a submit's
  acceptance and close (its value: states not saved);
* ``("chunk", id, Chunk)`` / ``("fail", id, error)`` for a generation's stream.

``error`` is :func:`error_payload`'s dict; :func:`error_from_payload` rebuilds
the same :class:`~ollapy.errors.OllapyError` subclass. Nothing here imports
llama_cpp: the parent unpickles every message without it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ollapy import errors
from ollapy.engine.interface import ContextFacts, RunnerSnapshot
from ollapy.errors import OllapyError, RunnerError, describe

# calls the child serves on a worker thread (runner interface methods of its LoadedModel)
CALLS = frozenset({"tokenize", "tokenize_text", "token_pieces", "render", "chat_prompt", "raw_prompt", "fim_prompt",
                   "grammar_for", "embed", "info", "stats", "cache_stats"})
STATUS_INTERVAL_S = 1.0  # how often the child sends its figures


def load_spec(ref, options, *, cache: bool, write_back: bool, max_queue: int, log_level: int) -> dict:
    """The ``load`` message's body: the model reference's fields (those ``open_model`` and the prompt cache
    read: name, path, digest, template, a vision model's projector), the load ``options`` and the parent's flags
    and log level."""
    projector = getattr(ref, "projector", None)
    return {
        "ref": {"name": ref.name, "path": os.path.abspath(ref.path), "digest": getattr(ref, "digest", None),
                "template": getattr(ref, "template", None),
                "projector": os.path.abspath(projector) if projector else None},
        "options": options, "cache": cache, "write_back": write_back, "max_queue": max_queue,
        "log_level": log_level,
    }


def error_payload(exc: BaseException) -> dict:
    """An exception as plain data: class name, message, hint, status, public text and simple attributes."""
    if isinstance(exc, OllapyError):
        extra = {k: v for k, v in vars(exc).items()
                 if k not in ("message", "hint", "public") and isinstance(v, (str, int, float, bool, type(None)))}
        return {"cls": type(exc).__name__, "message": exc.message, "hint": exc.hint, "public": exc.public,
                "status": exc.status, "extra": extra}
    return {"cls": type(exc).__name__, "message": describe(exc), "hint": "", "public": None, "status": 500,
            "extra": {}}


def error_from_payload(data: dict) -> OllapyError:
    """The :class:`~ollapy.errors.OllapyError` subclass named in ``data`` with its message, hint, status and
    attributes; a class ollapy.errors does not define (or a non-ollapy exception) becomes RunnerError."""
    cls = getattr(errors, data.get("cls") or "", None)
    if not (isinstance(cls, type) and issubclass(cls, OllapyError)):
        return RunnerError(data.get("message") or "model runner error", data.get("hint") or "")
    exc = cls.__new__(cls)
    OllapyError.__init__(exc, data.get("message") or "", data.get("hint") or "", public=data.get("public"))
    for k, v in (data.get("extra") or {}).items():
        setattr(exc, k, v)
    if data.get("status") not in (None, cls.status):
        exc.status = data["status"]
    return exc


@dataclass
class ReadyFacts:
    """What the child tells the parent once the model is loaded (the ``ready`` message): the model facts of
    the runner interface and its first :class:`~ollapy.engine.interface.RunnerSnapshot`."""

    pid: int
    architecture: str
    template: Any  # ollapy.chat.templates.Template
    facts: ContextFacts
    supports_tools: bool
    supports_thinking: bool
    embedding_only: bool
    load_duration_ns: int
    info: dict
    snapshot: RunnerSnapshot
    cache_block: int | None = None  # None: the model has no prompt cache
    supports_insert: bool = False  # FIM tokens or a template that reads ``suffix``


@dataclass(frozen=True)
class EmbeddingResult:
    """An embedding call's result in the parent, shaped as :class:`ollapy.engine.backend.embedding.Embeddings`:
    ``vectors`` float32 ``(n_inputs, dim)``, ``token_counts`` and ``truncated`` per input, ``duration_ns``,
    ``pooling``."""

    vectors: Any
    token_counts: tuple[int, ...]
    truncated: tuple[bool, ...] = ()
    duration_ns: int = 0
    pooling: str = ""

    @property
    def prompt_tokens(self) -> int:
        """Tokens evaluated over all inputs."""
        return sum(self.token_counts)

    @classmethod
    def of(cls, emb) -> EmbeddingResult:
        """The plain copy of an engine ``Embeddings`` (sent instead of it: that class lives beside llama_cpp)."""
        return cls(vectors=emb.vectors, token_counts=tuple(emb.token_counts), truncated=tuple(emb.truncated),
                   duration_ns=int(emb.duration_ns), pooling=str(emb.pooling))
