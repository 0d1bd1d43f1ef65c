"""HTTP helpers every route module shares: the request body, error responses, streaming and collecting.

A generation is answered either whole (:func:`collected`: read to the end,
cancelled if the client goes away) or streamed (:func:`ndjson_response` for
Ollama, :func:`sse_response` for OpenAI). A route states only its objects: the
helpers own the loop, the framing, the error after a stream started (the
stream's last line or event, as Ollama and OpenAI do) and closing the
generation when the client leaves.
"""
from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import StreamingResponse

from ollapy.errors import UsageError
from ollapy.server import generation
from ollapy.server.errors import error_headers, ollama_error, openai_error, sse_error_event, stream_error_line
from ollapy.surrogates import may_hold_surrogates, scrub_strings

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def state_of(request: Request):
    """The app's shared State (runtime, metrics)."""
    return request.app.state.ollapy


MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (a chat with tools needs about 10)."""


async def read_body(request: Request) -> dict:
    """The JSON object body (``{}`` when empty; lone surrogate escapes read as U+FFFD); UsageError (400) when it is
    not a JSON object, is not UTF-8, or nests deeper than :data:`MAX_DEPTH` levels (so no later step recurses
    without bound).

    The size limit (``OLLAPY_MAX_BODY``, 413) is enforced before this by the app's ``BodyLimit`` middleware."""
    raw = await request.body()
    if not raw.strip():
        return {}
    too_deep = False
    try:
        data = json.loads(raw)
    except ValueError:  # UnicodeDecodeError (not UTF-8) included
        raise UsageError("request body is not valid JSON") from None
    except RecursionError:
        too_deep = True
    if too_deep or nesting_depth(data) > MAX_DEPTH:
        raise UsageError(f"request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise UsageError("request body must be a JSON object")
    if may_hold_surrogates(raw):  # "\ud800": U+FFFD, as Ollama's JSON decoder reads it (ollapy/surrogates.py)
        data = scrub_strings(data)
    return data


def nesting_depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar is 0, ``[]`` is 1); iterative, so any depth is safe."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return deepest


def err(exc: BaseException) -> JSONResponse:
    """Ollama-style JSON error response: ``{"error": "..."}`` with the exception's status."""
    status, body = ollama_error(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))


def openai_err(exc: BaseException) -> JSONResponse:
    """OpenAI-style JSON error response: ``{"error": {"message", "type", "param", "code"}}``."""
    status, body = openai_error(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))


def errors_as_json(route: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Decorate a route whose every exception becomes :func:`err`'s JSON error (FastAPI still sees the
    route's own signature through ``functools.wraps``)."""

    @functools.wraps(route)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await route(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            return err(exc)

    return wrapper


def ndjson_line(obj: dict) -> bytes:
    """One NDJSON line (UTF-8, non-ASCII kept; compact, as Ollama's encoder writes it)."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def sse_event(obj: dict) -> bytes:
    """One Server-Sent Event ``data: {...}`` (UTF-8, non-ASCII kept; compact, as OpenAI's)."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


KEEPALIVE_S = 15.0
"""Seconds a Server-Sent Events answer may stay silent (a long prefill) before it sends :data:`KEEPALIVE`: Bun's
``fetch`` (Claude Code, Cline, Kilo and opencode are Bun executables) drops a response that sends no byte for
300 s whatever the agent's own timeout says (oven-sh/bun#16682), and a 16k-token agent prompt prefilled on a
CPU takes longer than that."""
KEEPALIVE = b": keepalive\n\n"
"""An SSE comment line (the spec's ``:`` line, which every event parser skips; OpenRouter sends the same kind)."""


async def with_keepalive(body: AsyncIterator[bytes], interval: float = KEEPALIVE_S,
                         ping: bytes = KEEPALIVE) -> AsyncIterator[bytes]:
    """``body``'s chunks, with ``ping`` sent after each ``interval`` seconds (> 0) that passed without one. The
    next chunk is awaited in a task of its own, so a ping never cancels ``body``; leaving early (the client gone)
    cancels that task, which ends ``body``."""
    assert interval > 0
    it = body.__aiter__()
    nxt = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=interval)
            if not done:
                yield ping
                continue
            try:
                chunk = nxt.result()
            except StopAsyncIteration:
                return
            yield chunk
            nxt = asyncio.ensure_future(it.__anext__())
    finally:
        nxt.cancel()


class GenStream(StreamingResponse):
    """A streaming response that watches for the client going away and always closes its generation;
    ``keepalive`` (SSE answers) sends :data:`KEEPALIVE` through silences of :data:`KEEPALIVE_S` seconds."""

    def __init__(self, content, on_close: Callable[[], None], media_type: str, keepalive: bool = False) -> None:
        super().__init__(with_keepalive(content, KEEPALIVE_S) if keepalive else content, media_type=media_type)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def run() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        break
                tg.cancel_scope.cancel()
        finally:
            self.on_close()


def ndjson_response(objects: AsyncIterator[dict], on_close: Callable[[], None]) -> GenStream:
    """Stream ``objects`` as NDJSON; an exception while streaming becomes the last line ``{"error": ...}``."""

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield ndjson_line(obj)
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the error is the last line
            yield stream_error_line(exc)

    return GenStream(lines(), on_close, NDJSON)


def sse_response(objects: AsyncIterator[dict], on_close: Callable[[], None]) -> GenStream:
    """Stream ``objects`` as Server-Sent Events ending with ``data: [DONE]``; an exception while streaming
    becomes the last event, OpenAI's error object."""

    async def events() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield sse_event(obj)
            yield b"data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the error is the last event
            yield sse_error_event(exc)

    return GenStream(events(), on_close, SSE, keepalive=True)


async def chunk_objects(gen: generation.Generation, objects_of: Callable[[Any], Iterable[dict]]) -> AsyncIterator[dict]:
    """The objects a route makes of each chunk of ``gen`` (``objects_of(chunk)``, zero or more per chunk)."""
    async for c in gen.chunks():
        for obj in objects_of(c):
            yield obj


async def watch_disconnect(request: Request, gen: generation.Generation) -> None:
    """For non-streaming answers: cancel the generation as soon as the client goes away (the body is read, so
    the server's next message is the disconnect: awaited, not polled, so an editor's abandoned completion frees
    its slot within an engine step)."""
    try:
        while not gen.finished and not gen.closed:
            msg = await request.receive()
            if msg.get("type") == "http.disconnect":
                gen.close("client gone")
                return
            await asyncio.sleep(0.05)  # another message (a body part nobody read): look again shortly
    except asyncio.CancelledError:
        pass


async def collect(request: Request, gen: generation.Generation) -> tuple[str, Any]:
    """Read a generation to the end (non-streaming): ``(text, final chunk)``."""
    watcher = asyncio.get_running_loop().create_task(watch_disconnect(request, gen))
    parts = []
    try:
        async for c in gen.chunks():
            parts.append(c.text)
    finally:
        watcher.cancel()
        gen.close()
    return "".join(parts), gen.final


async def collected(request: Request, gen: generation.Generation, build: Callable[[str, Any], dict],
                    on_error: Callable[[BaseException], JSONResponse] = err) -> JSONResponse:
    """The non-streaming answer: :func:`collect` ``gen``, then ``build(text, final chunk)`` as JSON; a failure is
    ``on_error``'s response (:func:`err` under /api, :func:`openai_err` under /v1)."""
    try:
        text, final = await collect(request, gen)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return on_error(exc)
    return JSONResponse(build(text, final))
