"""Anthropic's Messages API answers: the whole ``message`` object and its Server-Sent Events stream.

A stream is, as Anthropic's API sends it and the ``anthropic`` SDK's ``MessageStream`` reads it:
``message_start`` (the message with empty ``content`` and the prompt's usage), ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``, ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` (``stop_reason``, ``stop_sequence``, final ``usage``) and
``message_stop``. Each event is ``event: TYPE`` + ``data: JSON``. A ``ping`` also goes out every
:data:`PING_S` seconds while nothing else does (a long prefill). An error after the stream started is its last
event, ``event: error``.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, AsyncIterator, Iterator

from ollapy.chat.reply import ReplyDelta
from ollapy.server import generation
from ollapy.server.anthropic.bodies import tool_input_json
from ollapy.server.errors import anthropic_error_event
from ollapy.server.http import GenStream

SSE = "text/event-stream"
PING_S = 10.0
"""Seconds without an event after which a stream sends a ``ping`` (keeps agents' idle timers quiet)."""


def message_id() -> str:
    """A new ``msg_…`` id."""
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_…`` id for a parsed call's ``call_…`` id (the same suffix, so reproducible with a seed)."""
    return "toolu_" + call_id.removeprefix("call_")


def usage(m: dict) -> dict:
    """Anthropic's ``usage`` from Ollama-named metrics: ``input_tokens`` (prompt tokens evaluated, not served by
    the prompt cache), ``cache_read_input_tokens`` (served by it: ``prompt_cache_tokens``),
    ``cache_creation_input_tokens`` (0: ollapy's cache fills itself, nothing is billed for a write) and
    ``output_tokens``; ``input_tokens + cache_read_input_tokens`` is the whole prompt."""
    total, cached = int(m.get("prompt_eval_count") or 0), int(m.get("prompt_cache_tokens") or 0)
    return {"input_tokens": total - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": int(m.get("eval_count") or 0)}


def stop_reason(final, calls: int, requested: list[str] | None = None) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``: ``tool_use`` when the answer made calls, ``max_tokens`` when it hit the
    limit, ``stop_sequence`` (with the string) when one of the request's ``stop_sequences`` (``requested``) ended
    it, else ``end_turn``. A stop string of the model's own (a Modelfile ``PARAMETER stop``) ends its turn as its
    end-of-turn token would: Anthropic's ``stop_sequence`` names only "one of your custom stop sequences"."""
    if calls:
        return "tool_use", None
    if final.done_reason == "length":
        return "max_tokens", None
    seq = getattr(final, "stop_sequence", None)
    return ("stop_sequence", seq) if seq and seq in (requested or ()) else ("end_turn", None)


def content_blocks(d: ReplyDelta) -> list[dict]:
    """The ``content`` of a whole answer: a ``thinking`` block, a ``text`` block, one ``tool_use`` block per call
    (each only when present)."""
    out: list[dict] = []
    if d.thinking:
        out.append({"type": "thinking", "thinking": d.thinking, "signature": ""})
    if d.content:
        out.append({"type": "text", "text": d.content})
    out.extend({"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": c.arguments} for c in d.calls)
    return out


def message(gen: generation.Generation, model: str, msg_id: str, text: str, final,
            stop_sequences: list[str] | None = None) -> dict:
    """The non-streamed ``message`` object of a finished generation (``stop_sequences``: the request's)."""
    d = gen.split_text(text)
    reason, seq = stop_reason(final, len(d.calls), stop_sequences)
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content_blocks(d),
            "stop_reason": reason, "stop_sequence": seq, "usage": usage(gen.metrics())}


def sse(kind: str, data: dict) -> bytes:
    """One event: ``event: KIND`` and ``data: {"type": KIND, ...}``."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class BlockWriter:
    """The content-block events of one streamed answer: opens a block when the kind of text changes
    (thinking → text → tool calls), closes the open one, counts block indexes."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.calls = 0

    def _switch(self, kind: str, block: dict) -> Iterator[bytes]:
        yield from self.close()
        self.index += 1
        self.open = kind
        yield sse("content_block_start", {"index": self.index, "content_block": block})

    def close(self) -> Iterator[bytes]:
        """``content_block_stop`` of the open block, if any."""
        if self.open is not None:
            if self.open == "thinking":  # the SDK's ThinkingBlock carries a signature: ollapy signs nothing
                yield sse("content_block_delta", {"index": self.index, "delta": {"type": "signature_delta",
                                                                                  "signature": ""}})
            yield sse("content_block_stop", {"index": self.index})
            self.open = None

    def feed(self, d: ReplyDelta) -> Iterator[bytes]:
        """The events of one piece of the answer."""
        if d.thinking:
            if self.open != "thinking":
                yield from self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            yield sse("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta",
                                                                              "thinking": d.thinking}})
        if d.content:
            if self.open != "text":
                yield from self._switch("text", {"type": "text", "text": ""})
            yield sse("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": d.content}})
        for c in d.calls:
            self.calls += 1
            yield from self._switch("tool_use", {"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
                                                 "input": {}})
            yield sse("content_block_delta", {"index": self.index, "delta": {"type": "input_json_delta",
                                                                              "partial_json": tool_input_json(c.arguments)}})


async def _with_pings(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``chunks``, with None in between whenever :data:`PING_S` seconds pass without one."""
    it = chunks.__aiter__()
    nxt: asyncio.Future | None = None
    try:
        while True:
            if nxt is None:
                nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt}, timeout=PING_S)
            if not done:
                yield None
                continue
            try:
                c = nxt.result()
            except StopAsyncIteration:
                return
            nxt = None
            yield c
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()


PLAN_WAIT_S = 2.0
"""Seconds a stream's ``message_start`` waits for the engine to place the request (and know its prompt-cache hit)
before it goes out with ``cache_read_input_tokens`` 0; placing takes one engine step, a queued request longer."""


async def planned_cache_tokens(gen: generation.Generation, wait_s: float = PLAN_WAIT_S) -> int:
    """The prompt tokens the prompt cache serves for ``gen``, once the engine has placed it (at most ``wait_s`` s
    later: 0 when it has not by then, or when the runner cannot say, as a runner child process's requests)."""
    planned = getattr(gen.req, "planned", None)
    if planned is None:
        return 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while not planned.is_set() and loop.time() < deadline:
        await asyncio.sleep(0.005)
    return int(gen.req.metrics.prompt_cache_tokens) if planned.is_set() else 0


def message_stream(gen: generation.Generation, model: str, msg_id: str,
                   stop_sequences: list[str] | None = None) -> GenStream:
    """The SSE response of a streamed ``/v1/messages`` answer (see the module docstring; ``stop_sequences``: the
    request's)."""

    async def events() -> AsyncIterator[bytes]:
        # the usage as Anthropic's message_start gives it: the cache hit is known before the first token (the
        # engine places the request, then prefills), so a client reading only this event sees it
        cached = min(await planned_cache_tokens(gen), gen.prompt_tokens)
        start = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": gen.prompt_tokens - cached, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": cached, "output_tokens": 0}}
        yield sse("message_start", {"message": start})
        yield sse("ping", {})
        blocks = BlockWriter()
        try:
            async for c in _with_pings(gen.chunks()):
                if c is None:
                    yield sse("ping", {})
                    continue
                for ev in blocks.feed(gen.split(c)):
                    yield ev
                if c.done:
                    for ev in blocks.close():
                        yield ev
                    reason, seq = stop_reason(c, blocks.calls, stop_sequences)
                    yield sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                                "usage": usage(gen.metrics())})
                    yield sse("message_stop", {})
        except Exception as exc:  # noqa: BLE001 - the status is sent already: the error is the last event
            yield anthropic_error_event(exc)

    return GenStream(events(), gen.close, SSE, keepalive=True)
