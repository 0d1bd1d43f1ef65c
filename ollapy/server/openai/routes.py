"""OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Streaming is Server-Sent Events ending with ``data: [DONE]``;
``stream_options.include_usage`` adds a last chunk with ``usage`` and no
choices. ``response_format`` ``json_object`` / ``json_schema`` constrain the
output with a grammar. Sampling fields map to Ollama options
(``max_tokens`` → ``num_predict``...); the ``developer`` role is ``system``.
Errors use OpenAI's shape; a prompt that leaves no room for the answer in
``num_ctx`` is a 400 with code ``context_length_exceeded`` (unless ``options``
set ``truncate`` true, an ollapy extension: then it is cut as under ``/api``). ``/v1/completions`` with a
``suffix`` is a code completion (:mod:`ollapy.server.fim`).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Callable, Iterator

from fastapi import APIRouter, Request

from ollapy.chat.fim import FimRequest
from ollapy.chat.reply import ReplyDelta
from ollapy.errors import ModelNotFound
from ollapy.server import fim, generation
from ollapy.server.http import chunk_objects, collected, read_body, sse_response, state_of
from ollapy.server.http import openai_err as err
from ollapy.server.openai.bodies import ChatCompletionBody, CompletionBody, OpenAIBody

router = APIRouter(prefix="/v1")


def _chat_logprobs(req, items) -> dict | None:
    """OpenAI's chat ``logprobs`` object (``{"content": [...]}``), or None when the request did not ask."""
    if req.logprobs < 0:
        return None
    return {"content": generation.logprob_entries(items), "refusal": None}


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


def _finish_reason(done_reason: str | None, calls: int = 0) -> str:
    """OpenAI's ``finish_reason``: ``tool_calls`` when the answer made calls, else ``length`` or ``stop``."""
    if calls:
        return "tool_calls"
    return "length" if done_reason == "length" else "stop"


def tool_calls(calls, start: int = 0) -> list[dict]:
    """OpenAI's ``tool_calls`` (with ``index``, as stream deltas carry it): ``[{"index", "id", "type":
    "function", "function": {"name", "arguments": JSON text}}]``."""
    return [{"index": start + i, "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for i, c in enumerate(calls)]


REASONING_KEYS = ("reasoning", "reasoning_content")
"""The names a message or stream delta carries the reasoning under: Ollama's ``/v1`` writes ``reasoning``,
llama.cpp's server and vLLM ``reasoning_content``; both, so that clients of either read it unchanged."""


def _message(d: ReplyDelta) -> dict:
    """The non-streamed ``message``: content (None when only calls were made), the reasoning (under both
    :data:`REASONING_KEYS`), ``tool_calls`` (without stream indexes)."""
    msg: dict = {"role": "assistant", "content": d.content if d.content or not d.calls else None}
    if d.thinking:
        msg.update(dict.fromkeys(REASONING_KEYS, d.thinking))
    if d.calls:
        msg["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in tool_calls(d.calls)]
    return msg


def _usage(m: dict) -> dict:
    p, c = int(m.get("prompt_eval_count") or 0), int(m.get("eval_count") or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": int(m.get("prompt_cache_tokens") or 0)}}


def _sse_objects(gen: generation.Generation, body: OpenAIBody, base: dict, choice: Callable[[Any], dict | None],
                 last_choice: Callable[[Any], dict]):
    """A stream's objects: ``choice(chunk)`` for each chunk (None: nothing), ``last_choice(chunk)`` for the final
    one, then the usage chunk when ``stream_options.include_usage`` asked for it."""

    def objects(c) -> Iterator[dict]:
        ch = choice(c)
        if ch is not None:
            yield {**base, "choices": [ch]}
        if c.done:
            yield {**base, "choices": [last_choice(c)]}
            if body.include_usage:
                yield {**base, "choices": [], "usage": _usage(gen.metrics())}

    return sse_response(chunk_objects(gen, objects), gen.close)


@router.post("/chat/completions")
async def chat_completions(request: Request):
    st = state_of(request)
    try:
        body = ChatCompletionBody.from_dict(await read_body(request))
        gen = await generation.start(st, body.model, route="v1/chat/completions", messages=body.messages,
                                     options=body.ollama_options(), fmt=body.response_format,
                                     keep_alive=body.keep_alive, logprobs=body.logprob_count, tools=body.tools,
                                     tool_choice=body.choice, think=body.think_value,
                                     parallel_tool_calls=body.parallel_tool_calls, overflow="error")
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model,
            "system_fingerprint": "fp_ollapy"}

    def whole(text: str, final) -> dict:
        d = gen.split_text(text)
        return {**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": _message(d), "finish_reason": _finish_reason(final.done_reason, len(d.calls)),
             "logprobs": _chat_logprobs(gen.req, gen.logprobs)}], "usage": _usage(gen.metrics())}

    if not body.stream:
        return await collected(request, gen, whole, err)

    first = True
    calls = 0

    def delta(c) -> dict | None:
        nonlocal first, calls
        piece = gen.split(c)
        if not (piece or first or (gen.req.logprobs >= 0 and c.logprobs)):
            return None
        d: dict = {"role": "assistant", "content": piece.content} if first else {"content": piece.content}
        if piece.thinking:
            d.update(dict.fromkeys(REASONING_KEYS, piece.thinking))
        if piece.calls:
            d["tool_calls"] = tool_calls(piece.calls, calls)
            calls += len(piece.calls)
        first = False
        return {"index": 0, "delta": d, "finish_reason": None, "logprobs": _chat_logprobs(gen.req, c.logprobs)}

    return _sse_objects(gen, body, {**base, "object": "chat.completion.chunk"}, delta,
                        lambda c: {"index": 0, "delta": {}, "finish_reason": _finish_reason(c.done_reason, calls),
                                   "logprobs": None})


@router.post("/completions")
async def completions(request: Request):
    st = state_of(request)
    try:
        body = CompletionBody.from_dict(await read_body(request))
        if body.suffix:  # fill-in-the-middle, as Ollama's /v1/completions passes suffix to its generate
            gen = await fim.start_fim(st, body.model, FimRequest(prefix=body.prompt, suffix=body.suffix),
                                      route="v1/completions", options=body.ollama_options(),
                                      fmt=body.response_format, keep_alive=body.keep_alive,
                                      logprobs=body.logprob_count, overflow="error")
        else:
            gen = await generation.start(st, body.model, route="v1/completions", prompt=body.prompt, raw=True,
                                         options=body.ollama_options(), fmt=body.response_format,
                                         keep_alive=body.keep_alive, logprobs=body.logprob_count, overflow="error")
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    base = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": body.model,
            "system_fingerprint": "fp_ollapy", "object": "text_completion"}

    if not body.stream:
        return await collected(request, gen, lambda text, final: {**base, "choices": [
            {"index": 0, "text": text, "logprobs": _legacy_logprobs(gen.req, gen.logprobs, 0),
             "finish_reason": _finish_reason(final.done_reason)}], "usage": _usage(gen.metrics())}, err)

    offset = 0

    def piece(c) -> dict | None:
        nonlocal offset
        if not c.text:
            return None
        lp = _legacy_logprobs(gen.req, c.logprobs, offset)
        offset += len(c.text)
        return {"index": 0, "text": c.text, "logprobs": lp, "finish_reason": None}

    return _sse_objects(gen, body, base, piece,
                        lambda c: {"index": 0, "text": "", "logprobs": None, "finish_reason": _finish_reason(c.done_reason)})


def _model_obj(name: str, created: float) -> dict:
    owner = name.split("/")[0] if "/" in name else "library"
    return {"id": name, "object": "model", "created": int(created), "owned_by": owner}


@router.get("/models")
async def models(request: Request):
    try:
        from ollapy.store import list_models

        ms = await asyncio.to_thread(list_models)
        return {"object": "list", "data": [_model_obj(m.name, m.modified) for m in ms if not m.broken]}
    except Exception as exc:  # noqa: BLE001
        return err(exc)


@router.get("/models/{model:path}")
async def model(model: str, request: Request):
    try:
        from ollapy.store import list_models

        ms = await asyncio.to_thread(list_models)
        for m in ms:
            if not m.broken and (m.name == model or m.name == f"{model}:latest"):
                return _model_obj(m.name, m.modified)
        raise ModelNotFound(f"model {model!r} not found", name=model)
    except Exception as exc:  # noqa: BLE001
        return err(exc)
