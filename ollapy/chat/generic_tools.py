"""Tool calls on any model: llama.cpp's *generic* tool-call format, for chat templates without tool support.

Ollama answers a request with ``tools`` on such a template with a 400 ("does not support tools");
llama.cpp's server answers it with its generic format (``common/chat.cpp``, ``COMMON_CHAT_FORMAT_GENERIC``,
with minja's polyfills for the history), and so does ollapy:

* the prompt: the tools (as JSON) and an instruction are added to the system message
  (:func:`generic_messages`), and past tool calls and tool results are written into the text of
  assistant and user messages (:func:`history_messages`), since the template has no place for them;
* the answer is constrained by a JSON grammar (:func:`answer_schema`) to one of
  ``{"tool_call": {"name", "arguments"}}``, ``{"tool_calls": [{"name", "arguments"}, ...]}`` (when parallel
  calls are allowed) or ``{"response": "..."}`` (not when a call is forced);
* :class:`GenericCallParser` turns that JSON back into calls or content, streaming the ``response`` string as
  it is generated. A ``tool_calls`` array cut short (by ``num_predict``, say) gives the calls it completed, the
  cut one dropped, as llama.cpp's server does: its final parse after a length or stop-word cut is a *partial*
  parse (``is_partial = stop != STOP_TYPE_EOS``), which keeps the calls already read. Other text that is not one
  of these forms (a single ``tool_call`` or an array cut before its first call ends) is returned as content,
  unchanged.
* the answer as the model wrote it is remembered (:mod:`ollapy.chat.answer_memory`, by the calls or the
  ``response`` text it gave), and the next request's history writes that text again where the client sends
  the answer back (:func:`history_messages`): the grammar leaves the model its own spacing (``{ "tool_call": ...``),
  so JSON written anew would differ from the tokens the previous turn left in the KV cache, and the prompt cache
  could not reuse the previous answer.

The server's routes reach this through :func:`ollapy.server.generation.reply_plan` (every route that builds a
chat prompt: ``/api/chat``, ``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``). No HTTP, terminal
or llama_cpp here.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Iterable

from ollapy.chat import calljson
from ollapy.chat.answer_memory import written_history
from ollapy.chat.toolcalls import ToolCall, call_id_factory, selected_functions

log = logging.getLogger(__name__)

INSTRUCTION = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
               "reply to the user's request")
"""The instruction llama.cpp's generic format adds to the system prompt (its words)."""

TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
"""The sentence in front of the tools' JSON (minja's tools polyfill, its words)."""


def history_messages(messages: list[dict], model: str = "") -> list[dict]:
    """The chat messages with their tool parts written as text, for a template that has no place for them.

    An assistant message that this process generated for ``model`` becomes the answer as the model wrote it
    (:func:`ollapy.chat.answer_memory.written_history`); another one's ``tool_calls`` become its content: the
    JSON the generic format makes the model write (``{"tool_call": {"name", "arguments"}}`` for one call,
    ``{"tool_calls": [...]}`` for several), after any text it had; a ``tool`` message becomes a ``user`` message whose content is
    ``{"tool_response": {"tool": NAME, "content": RESULT}}`` (NAME when known). Other messages pass unchanged.
    """
    out = []
    for m in written_history(messages, model):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments") or {}}
                     for c in m["tool_calls"]]
            obj = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            text = json.dumps(obj, ensure_ascii=False)
            content = m.get("content") or ""
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{content}\n{text}" if content else text
        elif m.get("role") == "tool":
            resp: dict[str, Any] = {}
            if m.get("tool_name"):
                resp["tool"] = m["tool_name"]
            resp["content"] = m.get("content") or ""
            m = {"role": "user", "content": json.dumps({"tool_response": resp}, ensure_ascii=False)}
        out.append(m)
    return out


def generic_messages(messages: list[dict], tools: list[dict], model: str = "") -> list[dict]:
    """The chat to render for a generic-format request: :func:`history_messages` (an answer this process
    generated for ``model``, calls or a ``{"response": ...}``, is written as the model wrote it), with the tools'
    JSON and :data:`INSTRUCTION` appended to the first system message (or in a new one in front).

    ``tools``: OpenAI/Ollama function tools (``{"type": "function", "function": {...}}``)."""
    text = TOOLS_INTRO + json.dumps(tools, ensure_ascii=False, indent=2) + "\n\n" + INSTRUCTION
    msgs = history_messages(messages, model)
    if msgs and msgs[0].get("role") == "system":
        head = dict(msgs[0])
        head["content"] = f"{head.get('content') or ''}\n\n{text}" if head.get("content") else text
        return [head] + msgs[1:]
    return [{"role": "system", "content": text}] + msgs


def answer_schema(tools: list[dict], *, forced: bool = False, name: str | None = None, parallel: bool = True,
                  response: dict | None = None) -> dict:
    """The JSON schema that constrains a generic-format answer (llama.cpp's, as in ``common/chat.cpp``).

    One call object per function: ``{"name": const, "arguments": its parameters schema}``. ``parallel``: the
    answer is ``{"tool_calls": [call, ...]}`` (at least one), else ``{"tool_call": call}``. Unless ``forced``,
    ``{"response": ...}`` is the alternative: a string, or ``response`` (the request's own JSON schema, so
    structured output still holds). ``forced`` (``tool_choice`` required or a named function) always gives one
    ``tool_call``; ``name`` limits it to that function (OptionError when ``tools`` has none of that name).
    """
    fns = selected_functions(tools, name)

    def one(fn: dict) -> dict:
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else None
        return {"type": "object", "properties": {"name": {"type": "string", "const": fn["name"]},
                                                 "arguments": params or {"type": "object"}},
                "required": ["name", "arguments"]}

    calls = [one(f) for f in fns]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel and not forced:
        wrapped = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
                   "required": ["tool_calls"]}
    else:
        wrapped = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    if forced:
        return wrapped
    reply = {"type": "object", "properties": {"response": response or {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [wrapped, reply]}


_RESPONSE_HEAD = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_HEAD_TEXT = '{"response":"'


class GenericCallParser:
    """Streaming parser of a generic-format answer: ``feed`` pieces, then ``finish`` once; both return
    ``(content_delta, calls)`` as :class:`ollapy.chat.toolcalls.ToolCallParser` does.

    ``{"response": "..."}`` streams its string as content while it is generated (escapes decoded, a partial
    escape held back); a non-string ``response`` (a request's JSON schema) is content as JSON text.
    ``{"tool_call": {...}}`` / ``{"tool_calls": [...]}`` are calls (to ``tool_names`` only, when given), decided
    at the end; a ``tool_calls`` array cut short gives the calls it completed (:func:`complete_calls`). Anything
    else (not JSON, cut short, another shape) is content, exactly as written. ``ids``:
    every call gets an id (the model's ``id`` when it wrote one, else ``call_<8 hex>``, reproducible with
    ``seed``). Never raises on model text.
    """

    def __init__(self, *, ids: bool = False, seed: int | None = None, tool_names: Iterable[str] | None = None) -> None:
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._new_id = call_id_factory(seed) if ids else None
        self._buf = ""
        self._state = "head"  # head -> string (streaming a response) | json (buffered to the end)
        self._finished = False

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Add generated text; return ``(content_delta, completed_calls)``."""
        if self._finished:
            raise RuntimeError("GenericCallParser.feed after finish")
        self._buf += piece
        return self._step(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of output: flush held-back text and decide calls; ``(content_delta, calls)``."""
        if self._finished:
            return "", []
        self._finished = True
        return self._step(final=True)

    # -- internals
    def _step(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._state == "head":
            m = _RESPONSE_HEAD.match(self._buf)
            if m:
                self._state, self._buf = "string", self._buf[m.end():]
            elif final or not _HEAD_TEXT.startswith(re.sub(r"\s+", "", self._buf)):
                self._state = "json"
        if self._state == "string":
            return self._string(final), []
        if self._state == "json" and final:
            return self._whole()
        return "", []

    def _string(self, final: bool) -> str:
        """The decoded part of the ``response`` string that is complete so far."""
        buf, i, end = self._buf, 0, None
        safe = 0
        while i < len(buf):
            ch = buf[i]
            if ch == '"':
                end = i
                break
            if ch == "\\":
                need = 6 if buf[i + 1:i + 2] == "u" else 2
                if i + need > len(buf):
                    break
                if need == 6 and 0xD800 <= _hex(buf[i + 2:i + 6]) <= 0xDBFF:  # a high surrogate: wait for its pair
                    if i + 12 > len(buf):
                        break
                    need = 12
                i += need
            else:
                i += 1
            safe = i
        if end is not None:
            safe = end
        piece = buf[:safe]
        self._buf = buf[safe:]
        try:
            text = json.loads(f'"{piece}"')
        except ValueError:
            text = piece  # not valid JSON string text (no grammar held it): shown as written
        if end is not None:
            self._state, self._buf = "done", ""
        elif final:
            text += self._buf  # cut short inside the string: what was written is the answer
            self._buf = ""
        return text

    def _whole(self) -> tuple[str, list[ToolCall]]:
        text, self._buf = self._buf, ""
        try:
            value = calljson.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            if "response" in value and len(value) == 1 and calljson.shallow(value):
                r = value["response"]
                return (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)), []
            items = [value["tool_call"]] if "tool_call" in value else value.get("tool_calls")
            calls = self._calls(items) if isinstance(items, list) and items else None
            if calls:
                return "", calls
        elif value is None and (items := complete_calls(text)):
            calls = self._calls(items)
            if calls:
                log.debug("generic tool calls: a tool_calls array cut short, %d complete call(s) kept", len(calls))
                return "", calls
        log.debug("generic tool calls: not a call or a response, kept as content: %.80r", text)
        return text, []

    def _calls(self, items: list) -> list[ToolCall] | None:
        out = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                return None
            if self._names is not None and item["name"] not in self._names:
                return None
            args = calljson.arguments_of(item.get("arguments", {}))
            if args is None:
                return None
            call_id = None
            if self._new_id is not None:
                call_id = item["id"] if isinstance(item.get("id"), str) and item["id"] else self._new_id()
            out.append(ToolCall(item["name"], args, call_id))
        return out


_CALLS_HEAD = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')


def complete_calls(text: str) -> list | None:
    """The items of a ``{"tool_calls": [...]}`` answer that is not whole JSON (cut short) which the model wrote to
    their end: the array's leading complete items, up to the first one that does not end (dropped, with all after
    it); None when ``text`` does not open such an array or completes none of its items.

    llama.cpp's server returns these calls after a length cut (its partial parse keeps the calls it read; it also
    keeps a last call cut inside its arguments, with the arguments cut, which a client could not run: dropped
    here)."""
    m = _CALLS_HEAD.match(text)
    if not m:
        return None
    items, pos = [], m.end()
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        try:
            item, pos = calljson.raw_decode(text, pos)
        except ValueError:
            break
        items.append(item)
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if text[pos:pos + 1] != ",":
            break
        pos += 1
    return items or None


def _hex(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        return -1
