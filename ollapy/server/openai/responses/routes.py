"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A request is read by :class:`~ollapy.server.openai.responses.bodies.ResponsesBody`, runs on the shared generation
path (:func:`ollapy.server.generation.start`: the same prompt, tool-call and thinking code as
``/v1/chat/completions``, the generic tool-call format on templates without tools, ``text.format`` through the
grammar), and is answered whole or as the SDK's stream events
(:class:`~ollapy.server.openai.responses.stream.ResponseBuilder`). Stateless by default, as Ollama's; ``store: true``
keeps the response in the server's bounded :class:`~ollapy.server.openai.responses.store.ResponseStore`, which
``previous_response_id`` continues from (404 in OpenAI's error shape once it is gone). Errors use OpenAI's
error object.
"""
from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ollapy.server import generation
from ollapy.server.errors import openai_error
from ollapy.server.http import SSE, GenStream, collect, read_body, sse_event, state_of
from ollapy.server.http import openai_err as err
from ollapy.server.openai.responses.bodies import ResponsesBody, custom_tool_names
from ollapy.server.openai.responses.store import ResponseStore, StoredResponse
from ollapy.server.openai.responses.stream import ResponseBuilder, new_id

router = APIRouter(prefix="/v1")


def store_of(request: Request) -> ResponseStore:
    """The server's store of responses (:class:`~ollapy.server.app.State`)."""
    return state_of(request).responses


@router.post("/responses")
async def create_response(request: Request):
    st = state_of(request)
    store = store_of(request)
    try:
        raw = await read_body(request)
        body = ResponsesBody.from_dict(raw)
        previous = store.get(body.previous_response_id) if body.previous_response_id else None
        conversation = (previous.messages if previous is not None else []) + body.messages
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        gen = await generation.start(st, body.model, route="v1/responses", messages=system + conversation,
                                     options=body.ollama_options(), fmt=body.fmt, keep_alive=body.keep_alive,
                                     tools=body.tools, tool_choice=body.choice, think=body.think_value,
                                     parallel_tool_calls=body.parallel_tool_calls)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)
    builder = ResponseBuilder(new_id("resp"), body.model, raw, custom_tool_names(raw.get("tools")))

    def keep() -> None:
        if body.store:
            # the turns before it are the previous response's, shared (held here even if it was evicted meanwhile)
            store.put(builder.rid, StoredResponse(builder.response(), body.messages + builder.messages(), previous))

    if not body.stream:
        try:
            text, final = await collect(request, gen)
        except Exception as exc:  # noqa: BLE001
            return err(exc)
        builder.feed(gen.split_text(text))
        builder.finish(gen.metrics(), final.done_reason)
        keep()
        return JSONResponse(builder.response())

    async def events() -> AsyncIterator[bytes]:
        for ev in builder.start():
            yield _sse(ev)
        try:
            async for c in gen.chunks():
                for ev in builder.feed(gen.split(c)):
                    yield _sse(ev)
                if c.done:
                    for ev in builder.finish(gen.metrics(), c.done_reason):
                        yield _sse(ev)
                    keep()
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the error is the last event
            yield _sse(builder.error(openai_error(exc)[1]))

    return GenStream(events(), gen.close, SSE, keepalive=True)


def _sse(event: dict) -> bytes:
    """One Responses stream event: ``event: TYPE`` then its ``data``, as OpenAI sends them."""
    return f"event: {event['type']}\n".encode() + sse_event(event)


@router.get("/responses/{response_id}")
async def get_response(response_id: str, request: Request):
    try:
        return store_of(request).get(response_id).response
    except Exception as exc:  # noqa: BLE001
        return err(exc)


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    try:
        store = store_of(request)
        store.get(response_id)  # 404 when absent
        store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}
    except Exception as exc:  # noqa: BLE001
        return err(exc)
