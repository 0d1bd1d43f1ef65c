"""Embedding routes: Ollama's ``/api/embed`` and legacy ``/api/embeddings``, OpenAI's ``/v1/embeddings``.

Semantics follow Ollama's server (server/routes.go ``EmbedHandler``,
``EmbeddingsHandler``) and OpenAI's API:

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
* ``/v1/embeddings``: ``input`` a string, a list of strings, a list of token
  ids or a list of token-id lists (an empty list is a 400); ``encoding_format``
  ``float`` or ``base64`` (little-endian float32, as OpenAI sends it);
  ``dimensions``; ``usage`` counts the tokens evaluated.

The embedding runs on a worker thread on the model's own embedding context
(:mod:`ollapy.engine.backend.embedding`), so generation on the same model goes on
undisturbed. Errors: Ollama's ``{"error": "..."}`` under /api, OpenAI's error
object under /v1 (:mod:`ollapy.server.errors`).
"""
from __future__ import annotations

import base64
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import field_validator

from ..errors import OptionError
from ..options import api_options
from .bodies import NamedBody, check_name
from .http import err, openai_err, read_body, state_of

router = APIRouter()


class _EmbedBase(NamedBody):
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


class EmbedBody(_EmbedBase):
    """``/api/embed``: ``input`` as a string or a list of strings (read by :func:`ollama_inputs`)."""

    input: Any = None


class EmbeddingsBody(_EmbedBase):
    """Legacy ``/api/embeddings``: one ``prompt``."""

    prompt: str = ""


class OpenAIEmbedBody(_EmbedBase):
    """``/v1/embeddings``: ``input`` (:func:`openai_inputs`), ``encoding_format`` float or base64."""

    input: Any = None
    encoding_format: str = "float"
    user: Any = None

    @field_validator("encoding_format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v not in ("float", "base64"):
            raise OptionError(f"encoding_format must be 'float' or 'base64', got {v!r}")
        return v


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


def openai_inputs(value: Any) -> list[str] | list[list[int]]:
    """``/v1/embeddings``' ``input``: a string, a list of strings, a list of token ids (one input) or a list
    of token-id lists. Raises OptionError for a missing or empty input and for mixed or other types."""
    def token_list(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

    if value is None:
        raise OptionError("input is required", hint='send {"model": "NAME", "input": "text"}')
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise OptionError("input must be a non-empty string, list of strings or list of token arrays")
    if all(isinstance(v, str) for v in value):
        return list(value)
    if token_list(value):
        return [list(value)]
    if all(token_list(v) for v in value):
        return [list(v) for v in value]
    raise OptionError("invalid input: use a string, a list of strings, a list of token ids or a list of token-id lists")


async def _embed(request: Request, body: _EmbedBase, inputs: list, *, normalized: bool = True,
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


@router.post("/api/embed")
async def api_embed(request: Request):
    t0 = time.perf_counter_ns()
    try:
        body = EmbedBody.from_dict(await read_body(request))
        result, load_ns = await _embed(request, body, ollama_inputs(body.input))
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
        result, _ = await _embed(request, body, [body.prompt] if body.prompt else [], normalized=False, truncate=False)
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    return JSONResponse({"embedding": result.vectors[0].tolist() if result is not None else []})


@router.post("/v1/embeddings")
async def v1_embeddings(request: Request):
    try:
        body = OpenAIEmbedBody.from_dict(await read_body(request))
        result, _ = await _embed(request, body, openai_inputs(body.input))
    except Exception as exc:  # noqa: BLE001
        return openai_err(exc)
    if body.encoding_format == "base64":
        vecs = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in result.vectors]
    else:
        vecs = result.vectors.tolist()
    n = result.prompt_tokens
    return JSONResponse({"object": "list", "model": body.model,
                         "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)],
                         "usage": {"prompt_tokens": n, "total_tokens": n}})
