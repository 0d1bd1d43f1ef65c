"""OpenAI's ``/v1/embeddings``.

``input`` a string, a list of strings, a list of token ids or a list of token-id lists (an empty list is a
400); ``encoding_format`` ``float`` or ``base64`` (little-endian float32, as OpenAI sends it); ``dimensions``;
``usage`` counts the tokens evaluated. Errors are OpenAI's error object (:mod:`ollapy.server.errors`).
"""
from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import field_validator

from ollapy.errors import OptionError
from ollapy.server.embedding import EmbedBase, embed_inputs
from ollapy.server.http import openai_err, read_body

router = APIRouter()


class OpenAIEmbedBody(EmbedBase):
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


@router.post("/v1/embeddings")
async def v1_embeddings(request: Request):
    try:
        body = OpenAIEmbedBody.from_dict(await read_body(request))
        result, _ = await embed_inputs(request, body, openai_inputs(body.input))
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
