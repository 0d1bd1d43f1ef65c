"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Streaming is Server-Sent Events ending with ``data: [DONE]``;
``stream_options.include_usage`` adds a last chunk with ``usage`` and no
choices. ``response_format`` ``json_object`` / ``json_schema`` constrain the
output with a grammar. Sampling fields map to Ollama options
(``max_tokens`` → ``num_predict``...); the ``developer`` role is ``system``.
Errors use OpenAI's shape.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..errors import ModelNotFound, OptionError, UsageError
from . import generation
from .errors import openai_error, sse_error_event
from .ollama_routes import GenStream, check_name, collect, read_body, state_of

router = APIRouter(prefix="/v1")
SSE = "text/event-stream"


def err(exc: BaseException) -> JSONResponse:
    status, body = openai_error(exc)
    return JSONResponse(body, status_code=status)


def _options(data: dict) -> dict:
    """Ollama options from OpenAI sampling fields (validated later by Options.merged)."""
    opts: dict[str, Any] = {}
    mt = data.get("max_completion_tokens", data.get("max_tokens"))
    if mt is not None:
        opts["num_predict"] = mt
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed"),
                     ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty")):
        if data.get(src) is not None:
            opts[dst] = data[src]
    stop = data.get("stop")
    if stop is not None:
        opts["stop"] = [stop] if isinstance(stop, str) else stop
    n = data.get("n")
    if n not in (None, 1):
        raise OptionError("n must be 1", hint="ollapy returns one choice per request")
    if isinstance(data.get("options"), dict):  # ollapy/Ollama extension
        opts.update(data["options"])
    return opts


def _messages(messages: list) -> list:
    """OpenAI's ``developer`` role (its newer name for system instructions) read as ``system``, as
    llama.cpp's server maps it; other messages unchanged."""
    return [{**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m for m in messages]


def _response_format(rf: Any):
    if rf in (None, {}):
        return None
    if not isinstance(rf, dict):
        raise OptionError("response_format must be an object")
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        js = rf.get("json_schema") or {}
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise OptionError("response_format.json_schema.schema must be a JSON schema object")
        return schema
    raise OptionError(f"unsupported response_format type {kind!r}", hint="use text, json_object or json_schema")


def _chat_logprobs(req, items) -> dict | None:
    """OpenAI's chat ``logprobs`` object (``{"content": [...]}``), or None when the request did not ask."""
    if req.logprobs < 0:
        return None
    return {"content": generation.logprob_entries(items), "refusal": None}


def _legacy_logprobs_field(data: dict) -> int:
    """The legacy completions API's ``logprobs``: null, or the number of alternatives (0..5) per token."""
    n = data.get("logprobs")
    if n is None:
        return -1
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 5:
        raise OptionError(f"logprobs must be an integer from 0 to 5, got {n!r}")
    return n


def _legacy_logprobs(req, items, offset: int) -> dict | None:
    """The legacy completions ``logprobs`` object: tokens, token_logprobs, top_logprobs, text_offset."""
    if req.logprobs < 0:
        return None
    items = list(items or ())
    offsets = []
    for e in items:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in items], "token_logprobs": [e.logprob for e in items],
            "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in items], "text_offset": offsets}


def _finish_reason(done_reason: str | None) -> str:
    return "length" if done_reason == "length" else "stop"


def _usage(m: dict) -> dict:
    p, c = int(m.get("prompt_eval_count") or 0), int(m.get("eval_count") or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": int(m.get("prompt_cache_tokens") or 0)}}


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def _model_name(data: dict) -> str:
    name = data.get("model")
    if not isinstance(name, str) or not name.strip():
        raise UsageError("model is required")
    name = name.strip()
    check_name(name)
    return name


@router.post("/chat/completions")
async def chat_completions(request: Request):
    st = state_of(request)
    try:
        data = await read_body(request)
        name = _model_name(data)
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OptionError("messages must be a non-empty list")
        if data.get("tools"):
            raise OptionError("tools are not supported by ollapy")
        gen = await generation.start(st, name, route="v1/chat/completions", messages=_messages(messages),
                                     options=_options(data),
                                     fmt=_response_format(data.get("response_format")),
                                     keep_alive=data.get("keep_alive"),
                                     logprobs=generation.logprobs_field(data.get("logprobs"), data.get("top_logprobs")))
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    base = {"id": cid, "created": created, "model": name, "system_fingerprint": "fp_ollapy"}

    if not data.get("stream"):
        try:
            text, final = await collect(request, gen)
        except Exception as exc:  # noqa: BLE001
            return err(exc)
        return JSONResponse({**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish_reason(final.done_reason),
             "logprobs": _chat_logprobs(gen.req, gen.logprobs)}], "usage": _usage(gen.metrics())})

    include_usage = bool((data.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[bytes]:
        chunk = {**base, "object": "chat.completion.chunk"}
        try:
            first = True
            async for c in gen.chunks():
                if c.text or first:
                    delta = {"role": "assistant", "content": c.text} if first else {"content": c.text}
                    first = False
                    yield _sse({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                                      "logprobs": _chat_logprobs(gen.req, c.logprobs)}]})
                if c.done:
                    yield _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish_reason(c.done_reason),
                                                      "logprobs": None}]})
                    if include_usage:
                        yield _sse({**chunk, "choices": [], "usage": _usage(gen.metrics())})
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001
            yield sse_error_event(exc)

    return GenStream(events(), gen.close, SSE)


@router.post("/completions")
async def completions(request: Request):
    st = state_of(request)
    try:
        data = await read_body(request)
        name = _model_name(data)
        prompt = data.get("prompt", "")
        if isinstance(prompt, list):
            if len(prompt) != 1 or not isinstance(prompt[0], str):
                raise OptionError("prompt must be a string or a list of one string")
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise OptionError("prompt must be a non-empty string")
        gen = await generation.start(st, name, route="v1/completions", prompt=prompt, raw=True, options=_options(data),
                                     fmt=_response_format(data.get("response_format")),
                                     keep_alive=data.get("keep_alive"), logprobs=_legacy_logprobs_field(data))
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    cid = f"cmpl-{uuid.uuid4().hex[:24]}"
    base = {"id": cid, "created": int(time.time()), "model": name, "system_fingerprint": "fp_ollapy",
            "object": "text_completion"}

    if not data.get("stream"):
        try:
            text, final = await collect(request, gen)
        except Exception as exc:  # noqa: BLE001
            return err(exc)
        return JSONResponse({**base, "choices": [{"index": 0, "text": text,
                                                  "logprobs": _legacy_logprobs(gen.req, gen.logprobs, 0),
                                                  "finish_reason": _finish_reason(final.done_reason)}],
                             "usage": _usage(gen.metrics())})

    include_usage = bool((data.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[bytes]:
        try:
            offset = 0
            async for c in gen.chunks():
                if c.text:
                    lp = _legacy_logprobs(gen.req, c.logprobs, offset)
                    offset += len(c.text)
                    yield _sse({**base, "choices": [{"index": 0, "text": c.text, "logprobs": lp, "finish_reason": None}]})
                if c.done:
                    yield _sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                                     "finish_reason": _finish_reason(c.done_reason)}]})
                    if include_usage:
                        yield _sse({**base, "choices": [], "usage": _usage(gen.metrics())})
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001
            yield sse_error_event(exc)

    return GenStream(events(), gen.close, SSE)


def _model_obj(name: str, created: float) -> dict:
    owner = name.split("/")[0] if "/" in name else "library"
    return {"id": name, "object": "model", "created": int(created), "owned_by": owner}


@router.get("/models")
async def models(request: Request):
    try:
        from ..store import list_models

        ms = await asyncio.to_thread(list_models)
        return {"object": "list", "data": [_model_obj(m.name, m.modified) for m in ms if not m.broken]}
    except Exception as exc:  # noqa: BLE001
        return err(exc)


@router.get("/models/{model:path}")
async def model(model: str, request: Request):
    try:
        from ..store import list_models

        ms = await asyncio.to_thread(list_models)
        for m in ms:
            if not m.broken and (m.name == model or m.name == f"{model}:latest"):
                return _model_obj(m.name, m.modified)
        raise ModelNotFound(f"model {model!r} not found")
    except Exception as exc:  # noqa: BLE001
        return err(exc)
