"""Embedding requests shared by Ollama's ``/api/embed``, ``/api/embeddings`` and OpenAI's ``/v1/embeddings``.

:class:`EmbedBase` is the fields every embedding body has (``model``, ``options``, ``keep_alive``,
``truncate``, ``dimensions``); :func:`embed_inputs` loads the model (counted as a request on it), embeds on a
worker thread on the model's own embedding context (:mod:`ollapy.engine.backend.embedding`, so generation on the
same model goes on undisturbed) and releases the model. Each API's routes live in its package
(:mod:`ollapy.server.ollama.embed`, :mod:`ollapy.server.openai.embeddings`).
"""
from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import field_validator

from ollapy.errors import OptionError
from ollapy.options import api_options
from ollapy.server.bodies import NamedBody, check_name
from ollapy.server.http import state_of


class EmbedBase(NamedBody):
    """The fields every embedding body has; ``dimensions`` must be at least 1 (OptionError)."""

    options: Any = None
    keep_alive: Any = None
    truncate: bool = True
    dimensions: int | None = None

    @field_validator("model")
    @classmethod
    def _checked_name(cls, v: str) -> str:
        check_name(v)
        return v

    @field_validator("dimensions")
    @classmethod
    def _dimensions(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise OptionError(f"dimensions must be at least 1, got {v}")
        return v


async def embed_inputs(request: Request, body: EmbedBase, inputs: list, *, normalized: bool = True,
                 truncate: bool | None = None):
    """Load the model (counted as a request on it), embed ``inputs`` on a worker thread, release the model.

    Returns ``(Embeddings or None when inputs is empty, load_ns)``."""
    rt = state_of(request).runtime
    entry, _opts, load_ns = await rt.acquire(body.model, api_options(body.options), body.keep_alive)
    try:
        if not inputs:
            return None, load_ns
        result = await rt.call(entry, entry.model.embed, inputs, normalized=normalized,
                               truncate=body.truncate if truncate is None else truncate, dimensions=body.dimensions)
        return result, load_ns
    finally:
        await rt.release(entry)


