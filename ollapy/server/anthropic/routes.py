"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

What Claude Code and the ``anthropic`` SDKs speak, over the generation path the Ollama and OpenAI routes share
(:mod:`ollapy.server.generation`): the body (:mod:`.anthropic_bodies`) becomes chat messages, tools and a think
level; the answer is a ``message`` or its SSE stream (:mod:`.anthropic_stream`). ``tool_choice`` ``any`` and
``tool`` force one call with the grammar ``/v1/chat/completions`` uses for ``required``; ``thinking`` sets the
think level (dropped on a model whose template cannot think). A prompt that leaves no room for the answer is a
400 ``prompt is too long: N tokens > M maximum``. Every error, unknown routes under ``/v1/messages`` included,
is Anthropic's ``{"type": "error", "error": {"type", "message"}}``. The ``anthropic-version`` and
``anthropic-beta`` headers and ``?beta=true`` (Claude Code's) are accepted and change nothing.
"""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ollapy.server import generation
from ollapy.server.anthropic.bodies import CountTokensBody, MessagesBody
from ollapy.server.anthropic.stream import message, message_id, message_stream
from ollapy.server.errors import anthropic_error
from ollapy.server.http import collected, read_body, state_of

router = APIRouter(prefix="/v1")


def err(exc: BaseException) -> JSONResponse:
    """Anthropic-style JSON error response."""
    status, body = anthropic_error(exc)
    return JSONResponse(body, status_code=status)


@router.post("/messages")
async def messages(request: Request):
    st = state_of(request)
    try:
        body = MessagesBody.from_dict(await read_body(request))
        gen = await generation.start(st, body.model, route="v1/messages", messages=body.chat_messages(),
                                     options=body.ollama_options(), keep_alive=body.keep_alive,
                                     tools=body.openai_tools(), tool_choice=body.choice, think=body.think,
                                     parallel_tool_calls=body.parallel_tool_calls, overflow="error",
                                     optional_think=True)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)
    msg_id = message_id()
    if not body.stream:
        return await collected(request, gen, lambda text, final: message(gen, body.model, msg_id, text, final,
                                                                          body.stop_sequences), err)
    return message_stream(gen, body.model, msg_id, body.stop_sequences)


@router.post("/messages/count_tokens")
async def count_tokens(request: Request):
    try:
        body = CountTokensBody.from_dict(await read_body(request))
        n = await generation.count_tokens(state_of(request), body.model, messages=body.chat_messages(),
                                          tools=body.openai_tools(), tool_choice=body.choice, think=body.think,
                                          optional_think=True)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)
    return {"input_tokens": n}
