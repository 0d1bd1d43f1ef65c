"""The request body of ``POST /v1/responses`` (OpenAI's Responses API), read into ollapy's chat shape.

Field names and item shapes follow the official ``openai`` SDK's types (``ResponseCreateParams``,
``ResponseInputItemParam``, ``FunctionToolParam``). Read as every body is (:mod:`ollapy.server.ollama.bodies`: null =
absent, one-line errors naming the field, never a 422). ``input`` becomes chat messages
(:func:`input_messages`), flat function tools become the nested ``{"type": "function", "function": {...}}``
the prompt code takes, and ``text.format`` is a format for the existing grammar path.
"""
from __future__ import annotations

import logging
import reprlib
from typing import Any

from pydantic import Field, field_validator, model_validator

from ollapy.errors import OptionError
from ollapy.server.bodies import Body, checked_model, read_history, read_think, read_tools
from ollapy.server.openai.bodies import REASONING_EFFORTS, read_effort

log = logging.getLogger("ollapy.server")


def _text(content: Any, where: str, images: list | None = None) -> str:
    """A message's or a call output's content: a string, or text parts joined (others refused); ``input_image``
    parts go to ``images`` where it is given (a message's content)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OptionError(f"{where} must be a string or a list of content parts")
    from ollapy.server.content import RefusalPart, TextPart, read_part

    out = []
    for j, p in enumerate(content):
        part = read_part(p, f"{where}.{j}")  # every part's shape checked by its model (a 400 naming it)
        if isinstance(part, (TextPart, RefusalPart)):
            out.append(part.text)
        elif images is not None:
            images.append(p)  # decoded where the prompt is built (server.generation, through server.content)
        else:
            raise OptionError(f"{where}.{j}: image parts are not allowed here", hint="send input_text parts")
    return "".join(out)


def _reasoning_text(item: dict, where: str) -> str:
    """The text of a ``reasoning`` input item: its ``content`` parts, else its summary, else Ollama's plain
    ``encrypted_content``."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return _text(parts, f"{where}.{key}")
    enc = item.get("encrypted_content")
    return enc if isinstance(enc, str) else ""


def input_messages(value: Any) -> list[dict]:
    """``input`` as chat messages: a string is one user message; items (``message`` — also without ``type``
    when it has a ``role`` —, ``function_call``, ``function_call_output``, ``custom_tool_call`` (its ``input``
    is the argument ``input``, see :func:`read_response_tools`), ``custom_tool_call_output``, ``reasoning``)
    become system (``developer`` too), user, assistant (calls merged into the assistant turn before them,
    reasoning kept as its ``thinking``) and tool messages, checked by :func:`ollapy.server.ollama.bodies.read_history`.

    Raises OptionError (400) naming the item for anything else."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise OptionError("input must be a string or a list of input items")
    msgs: list[dict] = []
    thinking = ""
    for i, item in enumerate(value):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise OptionError(f"{where} must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise OptionError(f"{where}.role: invalid role {reprlib.repr(role)}",
                                  hint="use user, assistant, system or developer")
            imgs: list[dict] = []
            msg = {"role": "system" if role == "developer" else role,
                   "content": _text(item.get("content"), f"{where}.content", imgs)}
            if imgs:  # read by the prompt builder (server.generation), which decodes them for a vision model
                msg["content"] = [{"type": "text", "text": msg["content"]}, *imgs]
            if role == "assistant" and thinking:
                msg["thinking"], thinking = thinking, ""
            msgs.append(msg)
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name:
                raise OptionError(f"{where}.name is required")
            if kind == "custom_tool_call" and not isinstance(item.get("input"), str):
                raise OptionError(f"{where}.input must be a string")
            args = {"input": item["input"]} if kind == "custom_tool_call" else item.get("arguments") or "{}"
            call = {"type": "function", "function": {"name": name, "arguments": args}}
            if isinstance(call_id, str) and call_id:
                call["id"] = call_id
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
            if thinking:
                msgs[-1]["thinking"], thinking = thinking, ""
        elif kind in ("function_call_output", "custom_tool_call_output"):
            msg = {"role": "tool", "content": _text(item.get("output"), f"{where}.output")}
            if isinstance(item.get("call_id"), str) and item["call_id"]:
                msg["tool_call_id"] = item["call_id"]
            if isinstance(item.get("name"), str) and item["name"]:
                msg["tool_name"] = item["name"]
            msgs.append(msg)
        elif kind == "reasoning":
            thinking += _reasoning_text(item, where)
        else:
            raise OptionError(f"{where}: unsupported input item type {reprlib.repr(kind)}",
                              hint="use message, function_call(_output), custom_tool_call(_output) or reasoning items")
    try:
        return read_history(msgs)
    except OptionError as exc:  # read_history names "messages.N"; the client sent "input"
        raise OptionError(exc.message.replace("messages.", "input message ", 1), exc.hint) from None


CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
"""The parameters a custom (freeform) tool is called with: its text as the one string ``input``, as Ollama does."""


def read_response_tools(value: Any) -> list[dict] | None:
    """Responses ``tools`` as chat tools (``{"type": "function", "function": {...}}``, checked by
    :func:`read_tools`): flat function tools (``{"type": "function", "name", "description", "parameters"}``),
    custom (freeform) tools as functions taking :data:`CUSTOM_INPUT` (their ``format`` grammar is not
    applied), and the function tools inside a ``namespace`` tool (Codex groups MCP tools so). Built-in tool
    types (web_search, file_search, mcp...) run on OpenAI's side: they are left out with a log line, as the
    Anthropic route leaves out server tools, so an agent that always sends them still gets its answer."""
    if not value:
        return None
    if not isinstance(value, list):
        raise OptionError("tools must be a list of function tools")
    out = []
    flat: list[tuple[str, Any]] = [(str(i), t) for i, t in enumerate(value)]
    while flat:
        where, t = flat.pop(0)
        if not isinstance(t, dict):
            raise OptionError(f"tools.{where}: a tool must be an object",
                              hint='e.g. {"type": "function", "name": ..., "parameters": ...}')
        kind = t.get("type")
        if kind == "namespace" and isinstance(t.get("tools"), list):
            flat[:0] = [(f"{where}.tools.{j}", x) for j, x in enumerate(t["tools"])]
            continue
        if kind not in ("function", "custom"):
            log.info("responses: tool %s of type %s left out (ollapy runs the client's function tools only)",
                     where, reprlib.repr(kind))
            continue
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        if kind == "custom":
            fn["parameters"] = CUSTOM_INPUT
        out.append({"type": "function", "function": fn})
    return read_tools(out) if out else None


def custom_tool_names(value: Any) -> frozenset[str]:
    """The names of the custom (freeform) tools in a request's raw ``tools``: their calls are answered as
    ``custom_tool_call`` items."""
    if not isinstance(value, list):
        return frozenset()
    return frozenset(t["name"] for t in value if isinstance(t, dict) and t.get("type") == "custom"
                     and isinstance(t.get("name"), str))


def read_response_tool_choice(value: Any) -> tuple[str, str | None]:
    """Responses ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function"|"custom",
    "name"}``, as ``(mode, function name or None)``."""
    if value is None or value == "auto":
        return "auto", None
    if value in ("none", "required"):
        return value, None
    if (isinstance(value, dict) and value.get("type") in ("function", "custom") and isinstance(value.get("name"), str)
            and value["name"]):
        return "required", value["name"]
    raise OptionError(f"invalid tool_choice {reprlib.repr(value)}",
                      hint='use "auto", "none", "required" or {"type": "function", "name": ...}')


def read_text_format(text: Any) -> Any:
    """``text.format`` as a format for the grammar: None (``text``), ``"json"`` (``json_object``) or the
    ``json_schema``'s ``schema``."""
    if not text:
        return None
    if not isinstance(text, dict):
        raise OptionError("text must be an object such as {\"format\": {\"type\": \"json_schema\", ...}}")
    fmt = text.get("format")
    if not fmt:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise OptionError("text.format.schema must be a JSON schema object")
        return schema
    raise OptionError(f"unsupported text.format type {reprlib.repr(kind)}", hint="use text, json_object or json_schema")


class ResponsesBody(Body):
    """``/v1/responses``: what ollapy reads of OpenAI's ``ResponseCreateParams``.

    ``model``; ``input`` (:func:`input_messages`; may be empty only after a ``previous_response_id``);
    ``instructions`` (a system message in front, not carried to later responses); ``tools``/``tool_choice``/
    ``parallel_tool_calls``; ``max_output_tokens`` (``num_predict``), ``temperature``, ``top_p``; ``text.format``
    (:func:`read_text_format`); thinking from ``reasoning.effort``, ``reasoning_effort`` or Ollama's ``think``;
    ``store`` (default false: stateless, as Ollama) and ``previous_response_id``; ``metadata`` (echoed);
    ``stream``; and the ollapy/Ollama extensions ``options`` and ``keep_alive``. ``background`` and
    ``conversation`` are refused (ollapy has neither background jobs nor conversation objects).
    """

    model: Any = Field("", validate_default=True)
    input: Any = None
    instructions: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    max_output_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    text: Any = None
    reasoning: Any = None
    reasoning_effort: Any = None
    think: Any = None
    store: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    options: Any = None
    keep_alive: Any = None
    background: bool = False
    conversation: Any = None

    _think = field_validator("think")(classmethod(lambda cls, v: read_think(v)))

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> str:
        return checked_model(v, hint='send {"model": "NAME", "input": ...}')

    @field_validator("input")
    @classmethod
    def _input(cls, v: Any) -> list[dict]:
        return input_messages(v)

    @field_validator("instructions")
    @classmethod
    def _instructions(cls, v: Any) -> str:
        if not isinstance(v, str):
            raise OptionError("instructions must be a string")
        return v

    _tools = field_validator("tools")(classmethod(lambda cls, v: read_response_tools(v)))
    _tool_choice = field_validator("tool_choice")(classmethod(lambda cls, v: read_response_tool_choice(v)))
    _text_format = field_validator("text")(classmethod(lambda cls, v: read_text_format(v)))

    _effort = field_validator("reasoning_effort", "reasoning")(classmethod(lambda cls, v, info: read_effort(v, info.field_name)))

    @field_validator("background", "conversation")
    @classmethod
    def _unsupported(cls, v: Any, info) -> Any:
        if v:
            raise OptionError(f"{info.field_name} is not supported by ollapy",
                              hint="leave it out; use previous_response_id with store: true to chain responses")
        return v

    @model_validator(mode="after")
    def _checks(self):
        if not self.input and not self.previous_response_id:
            raise OptionError("input is required", hint='send "input": "text" or a list of input items')
        if self.choice[0] == "required" and not self.tools:
            raise OptionError("tool_choice requires tools", hint="send the functions in tools, or leave tool_choice out")
        return self

    @property
    def messages(self) -> list[dict]:
        """This request's input as chat messages (without ``instructions``)."""
        return self.input or []

    @property
    def choice(self) -> tuple[str, str | None]:
        """``(mode, function name or None)`` of ``tool_choice``."""
        return self.tool_choice or ("auto", None)

    @property
    def fmt(self) -> Any:
        """The format ``text.format`` asks for (None, ``"json"`` or a JSON schema)."""
        return self.text

    @property
    def effort(self) -> str | None:
        """The reasoning effort as sent (``reasoning.effort``, else ``reasoning_effort``), or None."""
        return self.reasoning or self.reasoning_effort

    @property
    def think_value(self) -> bool | str | None:
        """The ``think`` this request asks for: ``think``, else the effort (``none`` is off)."""
        if self.think is not None:
            return self.think
        return None if self.effort is None else REASONING_EFFORTS[self.effort]

    def ollama_options(self) -> dict:
        """Ollama options: ``max_output_tokens`` → ``num_predict``, ``temperature``, ``top_p``, then ``options``."""
        opts: dict[str, Any] = {}
        if self.max_output_tokens is not None:
            opts["num_predict"] = self.max_output_tokens
        for name in ("temperature", "top_p"):
            if getattr(self, name) is not None:
                opts[name] = getattr(self, name)
        if isinstance(self.options, dict):
            opts.update(self.options)
        return opts
