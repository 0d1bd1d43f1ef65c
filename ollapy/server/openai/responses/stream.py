"""The Response object of ``/v1/responses`` and its stream events, built from a reply's pieces.

One :class:`ResponseBuilder` serves both answers: a stream feeds it each :class:`~ollapy.chat.reply.ReplyDelta`
and sends the events it returns; a whole answer feeds it the whole reply once and sends
:meth:`ResponseBuilder.response`. Shapes and event order follow the official ``openai`` SDK's types and its
``responses.stream`` helper: ``response.created`` and ``response.in_progress`` first; per output item
``response.output_item.added`` ... ``response.output_item.done`` with, in between, for a message
``response.content_part.added``, ``response.output_text.delta``/``done``, ``response.content_part.done``,
for reasoning the same with ``response.reasoning_text.*`` parts, and for a function call
``response.function_call_arguments.delta``/``done`` (``response.custom_tool_call_input.delta``/``done`` for
a custom tool's call); last ``response.completed`` (or ``response.incomplete``
when ``max_output_tokens`` cut the answer short). Every event has a ``sequence_number`` counting from 0.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ollapy.chat.reply import ReplyDelta


def new_id(prefix: str) -> str:
    """An id as OpenAI's look: ``PREFIX_`` and 32 hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(metrics: dict) -> dict:
    """Responses ``usage`` from a generation's metrics (Ollama's names): ``input_tokens`` (prompt tokens),
    ``input_tokens_details.cached_tokens`` (of them, how many the prompt cache served: ``prompt_cache_tokens``),
    ``output_tokens`` and ``total_tokens``. ``cache_write_tokens`` and ``reasoning_tokens`` are not counted
    apart by the engine and are 0."""
    p, c = int(metrics.get("prompt_eval_count") or 0), int(metrics.get("eval_count") or 0)
    return {"input_tokens": p, "input_tokens_details": {"cached_tokens": int(metrics.get("prompt_cache_tokens") or 0),
                                                        "cache_write_tokens": 0},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": p + c}


def response_object(rid: str, model: str, created: float, request: dict, *, status: str, output: list[dict],
                    usage: dict | None = None, incomplete: str | None = None) -> dict:
    """A ``Response`` object: ``id``, ``status``, ``output`` and ``usage``, with the request's settings echoed
    as OpenAI does (``request``: the request body as sent; ``tools``, ``tool_choice``, ``text``, ``reasoning``,
    ``instructions``, ``metadata``, ``temperature``, ``top_p``, ``max_output_tokens``, ``parallel_tool_calls``,
    ``previous_response_id``, ``store``)."""
    fmt = request.get("text") if isinstance(request.get("text"), dict) else None
    effort = request.get("reasoning") if isinstance(request.get("reasoning"), dict) else None
    if effort is None and isinstance(request.get("reasoning_effort"), str):
        effort = {"effort": request["reasoning_effort"]}
    return {
        "id": rid, "object": "response", "created_at": int(created), "status": status, "model": model,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None, "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.get("instructions"), "metadata": request.get("metadata") or {},
        "output": output, "parallel_tool_calls": request.get("parallel_tool_calls") is not False,
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": effort.get("effort"), "summary": None} if effort else None,
        "store": bool(request.get("store")),
        "text": {"format": (fmt or {}).get("format") or {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto", "tools": request.get("tools") or [],
        "truncation": "disabled", "usage": usage,
    }


class ResponseBuilder:
    """Output items and stream events of one response, from the reply's pieces.

    ``feed(delta)`` returns the events for a piece (reasoning, text, tool calls, in the order they come: a change
    of kind closes the open item); ``finish(metrics, done_reason)`` closes the open item and returns the last
    events. ``response(...)`` is the Response object at any time; :attr:`output` holds the finished items.
    """

    def __init__(self, rid: str, model: str, request: dict, custom: frozenset[str] = frozenset()) -> None:
        self.rid = rid
        self.custom = custom  # names of custom (freeform) tools: their calls are custom_tool_call items
        self.model = model
        self.request = request
        self.created = time.time()
        self.seq = 0
        self.output: list[dict] = []
        self._open: dict | None = None  # the item being streamed (reasoning or message)
        self._text = ""
        self.incomplete: str | None = None
        self.usage: dict | None = None

    @property
    def status(self) -> str:
        """``completed``, ``incomplete`` (cut short) or ``in_progress`` (not finished)."""
        if self.usage is None:
            return "in_progress"
        return "incomplete" if self.incomplete else "completed"

    def response(self) -> dict:
        """The Response object now (finished items only)."""
        return response_object(self.rid, self.model, self.created, self.request, status=self.status,
                               output=list(self.output), usage=self.usage, incomplete=self.incomplete)

    def _event(self, kind: str, **fields: Any) -> dict:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self) -> list[dict]:
        """``response.created`` and ``response.in_progress``."""
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def _where(self) -> dict:
        return {"item_id": self._open["id"], "output_index": len(self.output)}

    def _open_item(self, kind: str) -> list[dict]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close()
        self._text = ""
        if kind == "reasoning":
            self._open = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            self._open = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                          "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events.append(self._event("response.output_item.added", output_index=len(self.output), item=dict(self._open)))
        events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=part))
        return events

    def _close(self) -> list[dict]:
        item = self._open
        if item is None:
            return []
        where = self._where()
        status = "incomplete" if self.incomplete else "completed"
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": self._text}
            events = [self._event("response.reasoning_text.done", **where, content_index=0, text=self._text)]
        else:
            part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
            events = [self._event("response.output_text.done", **where, content_index=0, text=self._text, logprobs=[])]
        events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        done = {**item, "content": [part], "status": status}
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=done))
        self.output.append(done)
        self._open = None
        return events

    def _calls(self, delta: ReplyDelta) -> list[dict]:
        events = self._close()
        for c in delta.calls:
            if c.name in self.custom:
                events += self._custom_call(c.id, c.name, str(c.arguments.get("input", "")))
                continue
            args = json.dumps(c.arguments, ensure_ascii=False)
            item = {"id": new_id("fc"), "type": "function_call", "call_id": c.id, "name": c.name, "arguments": "",
                    "status": "in_progress"}
            where = {"item_id": item["id"], "output_index": len(self.output)}
            events.append(self._event("response.output_item.added", output_index=where["output_index"], item=dict(item)))
            events.append(self._event("response.function_call_arguments.delta", **where, delta=args))
            events.append(self._event("response.function_call_arguments.done", **where, arguments=args, name=c.name))
            done = {**item, "arguments": args, "status": "completed"}
            events.append(self._event("response.output_item.done", output_index=where["output_index"], item=done))
            self.output.append(done)
        return events

    def _custom_call(self, call_id: str | None, name: str, text: str) -> list[dict]:
        item = {"id": new_id("ctc"), "type": "custom_tool_call", "call_id": call_id, "name": name, "input": "",
                "status": "in_progress"}
        where = {"item_id": item["id"], "output_index": len(self.output)}
        done = {**item, "input": text, "status": "completed"}
        self.output.append(done)
        return [self._event("response.output_item.added", output_index=where["output_index"], item=item),
                self._event("response.custom_tool_call_input.delta", **where, delta=text),
                self._event("response.custom_tool_call_input.done", **where, input=text),
                self._event("response.output_item.done", output_index=where["output_index"], item=done)]

    def error(self, body: dict) -> dict:
        """The stream's last event when it fails after it started: ``error`` with OpenAI's error object's
        ``code`` and ``message`` (``body``: ``{"error": {...}}``)."""
        e = body["error"]
        return self._event("error", code=e.get("code"), message=e["message"], param=e.get("param"))

    def feed(self, delta: ReplyDelta) -> list[dict]:
        """The events for one piece of the reply (none for an empty piece)."""
        events: list[dict] = []
        for kind, text in (("reasoning", delta.thinking), ("message", delta.content)):
            if text:
                events += self._open_item(kind)
                self._text += text
                name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
                extra = {} if kind == "reasoning" else {"logprobs": []}
                events.append(self._event(name, **self._where(), content_index=0, delta=text, **extra))
        if delta.calls:
            events += self._calls(delta)
        return events

    def finish(self, metrics: dict, done_reason: str | None) -> list[dict]:
        """Close the answer: the open item's last events, then ``response.completed`` (or ``response.incomplete``
        with ``incomplete_details.reason`` ``max_output_tokens`` when it stopped for length). A reply with no
        output at all gets an empty message, so that ``output_text`` reads ``""``."""
        if done_reason == "length":
            self.incomplete = "max_output_tokens"
        events = self._open_item("message") if not self.output and self._open is None else []
        events += self._close()
        self.usage = usage_of(metrics)
        kind = "response.incomplete" if self.incomplete else "response.completed"
        events.append(self._event(kind, response=self.response()))
        return events

    def messages(self) -> list[dict]:
        """The output as chat messages (one assistant turn: its reasoning as ``thinking``, text, tool calls),
        for :class:`~ollapy.server.openai.responses.store.StoredResponse`."""
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        for item in self.output:
            if item["type"] == "reasoning":
                msg["thinking"] = msg.get("thinking", "") + item["content"][0]["text"]
            elif item["type"] == "message":
                msg["content"] += item["content"][0]["text"]
            elif item["type"] == "custom_tool_call":
                msg.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": {"input": item["input"]}}})
            else:
                msg.setdefault("tool_calls", []).append(
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": json.loads(item["arguments"])}})
        return [msg]
