"""Ollama's embedding routes: ``/api/embed`` and legacy ``/api/embeddings``.

Semantics follow Ollama's server (server/routes.go ``EmbedHandler``,
``EmbeddingsHandler``):

* ``/api/embed``: ``input`` a string or a list of strings; vectors are
  L2-normalised; ``dimensions`` keeps the first N values and normalises again;
  ``truncate`` (default true) cuts an input to the context, false makes an
  over-long input a 400; no ``input`` (or ``""`` or ``[]``) only loads the model
  and answers ``embeddings: []``, as Ollama does. Answers ``model``,
  ``embeddings``, ``total_duration``, ``load_duration`` (ns) and
  ``prompt_eval_count``.
* ``/api/embeddings`` (deprecated in Ollama): ``prompt`` → ``embedding``, the
  pooled vector NOT normalised (Ollama returns the runner's vector as is);
  an empty prompt loads the model and answers ``embedding: []``.

The embedding runs on a worker thread on the model's own embedding context
(:mod:`ollapy.engine.backend.embedding`), so generation on the same model goes on
undisturbed. Errors: Ollama's ``{"error": "..."}`` (:mod:`ollapy.server.errors`).
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ollapy.errors import OptionError
from ollapy.server.embedding import EmbedBase, embed_inputs
from ollapy.server.http import err, read_body

router = APIRouter()


class EmbedBody(EmbedBase):
    """``/api/embed``: ``input`` as a string or a list of strings (read by :func:`ollama_inputs`)."""

    input: Any = None


class EmbeddingsBody(EmbedBase):
    """Legacy ``/api/embeddings``: one ``prompt``."""

    prompt: str = ""


def ollama_inputs(value: Any) -> list[str]:
    """``/api/embed``'s ``input`` as a list of texts (``[]`` for none, as Ollama: the request only loads the
    model). Raises OptionError ("invalid input type") for anything but a string or a list of strings."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise OptionError("invalid input type: input must be a string or a list of strings")


@router.post("/api/embed")
async def apiembed_inputs(request: Request):
    t0 = time.perf_counter_ns()
    try:
        body = EmbedBody.from_dict(await read_body(request))
        result, load_ns = await embed_inputs(request, body, ollama_inputs(body.input))
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)
    if result is None:
        return JSONResponse({"model": body.model, "embeddings": []})
    return JSONResponse({"model": body.model, "embeddings": result.vectors.tolist(),
                         "total_duration": time.perf_counter_ns() - t0, "load_duration": load_ns,
                         "prompt_eval_count": result.prompt_tokens})


@router.post("/api/embeddings")
async def api_embeddings(request: Request):
    try:
        body = EmbeddingsBody.from_dict(await read_body(request))
        # as Ollama's EmbeddingsHandler: the runner's vector as is, no truncation, an empty prompt only loads
        result, _ = await embed_inputs(request, body, [body.prompt] if body.prompt else [], normalized=False, truncate=False)
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    return JSONResponse({"embedding": result.vectors[0].tolist() if result is not None else []})
