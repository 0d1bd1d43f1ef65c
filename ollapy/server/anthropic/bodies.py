"""Request bodies of Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as pydantic models.

The wire format is the one the official ``anthropic`` SDK's ``MessageCreateParams`` types describe: ``system``
as a string or text blocks; ``messages`` whose ``content`` is a string or a list of ``text``, ``tool_use``,
``tool_result``, ``thinking`` and ``redacted_thinking`` blocks; ``tools`` (``name``, ``description``,
``input_schema``); ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``); ``thinking`` (``enabled`` with
``budget_tokens``, ``adaptive``, ``disabled``). Bodies are read as every ollapy body is (:class:`~.bodies.Body`:
unknown fields ignored, ``null`` absent, one-line errors, never a 422); :meth:`MessagesBody.chat` turns one into
the chat messages, tools and think level the shared generation path (:mod:`ollapy.server.generation`) takes.
"""
from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ollapy.errors import OptionError
from ollapy.server.bodies import Body, checked_model, read_history
from ollapy.server.content import ImageSource

log = logging.getLogger("ollapy.server")

#: ``thinking.budget_tokens`` below which a request gets think level ``low``, then ``medium``; above: ``high``.
THINK_BUDGET_LEVELS = ((4096, "low"), (16384, "medium"))


class TextBlock(Body):
    """``{"type": "text", "text": ...}`` (``cache_control`` and ``citations`` are accepted and ignored)."""

    type: Literal["text"]
    text: str


class ToolUseBlock(Body):
    """An assistant's tool call: ``{"type": "tool_use", "id", "name", "input": {...}}``."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = {}


class ToolResultBlock(Body):
    """A user's answer to a call: ``{"type": "tool_result", "tool_use_id", "content": str | [text blocks],
    "is_error"}``."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False

    @property
    def text(self) -> str:
        """The result as one string (text blocks joined by newlines; ``Error: `` in front when ``is_error``)."""
        body = self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(Body):
    """An assistant's earlier reasoning: ``{"type": "thinking", "thinking", "signature"}``."""

    type: Literal["thinking"]
    thinking: str = ""
    signature: str | None = None


class RedactedThinkingBlock(Body):
    """``{"type": "redacted_thinking", "data"}``: accepted, not rendered (ollapy never sends one)."""

    type: Literal["redacted_thinking"]
    data: str = ""


class ImageBlock(Body):
    """``{"type": "image", "source": {"type": "base64", "media_type", "data"}}``, for a vision model (a ``url``
    source is refused where the prompt is built: the server never fetches images)."""

    type: Literal["image"]
    source: ImageSource


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | ImageBlock,
                         Field(discriminator="type")]
_BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image")


class MessageParam(Body):
    """One turn: ``role`` ``user``, ``assistant`` or ``system`` (the SDK's ``SystemMessageParam``, text only, which
    Claude Code sends between turns), ``content`` a list of content blocks (a string is read as one text block)."""

    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, v: Any) -> Any:
        if isinstance(v, str):  # shorthand for one text block
            return [{"type": "text", "text": v}]
        for b in v if isinstance(v, list) else ():
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "document":
                raise OptionError(f"{kind} content blocks are not supported by ollapy models",
                                  hint="send text blocks")
            if kind not in _BLOCK_TYPES:
                raise OptionError(f"unsupported content block type {kind!r}",
                                  hint="use " + ", ".join(_BLOCK_TYPES))
        return v



class ToolParam(Body):
    """A client tool: ``name``, ``description``, ``input_schema`` (a JSON schema object). Anthropic's server tools
    (a ``type`` such as ``web_search_20250305``) are not run by ollapy: :meth:`MessagesBody.chat` leaves them out."""

    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None

    @property
    def is_client_tool(self) -> bool:
        """Whether this is a function the client runs (no type, or ``custom``)."""
        return self.type in (None, "custom")


class ToolChoiceParam(Body):
    """``{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _tool_needs_name(self) -> ToolChoiceParam:
        if self.type == "tool" and not self.name:
            raise OptionError('tool_choice of type "tool" needs the tool\'s name',
                              hint='send {"type": "tool", "name": NAME}')
        return self


class ThinkingParam(Body):
    """``{"type": "enabled", "budget_tokens": N}``, ``{"type": "adaptive"}`` or ``{"type": "disabled"}``."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)

    @property
    def think(self) -> bool | str:
        """The think level: False (disabled), True (adaptive), else by budget (:data:`THINK_BUDGET_LEVELS`)."""
        if self.type == "disabled":
            return False
        if self.type == "adaptive" or self.budget_tokens is None:
            return True
        return next((lvl for limit, lvl in THINK_BUDGET_LEVELS if self.budget_tokens < limit), "high")


class CountTokensBody(Body):
    """``/v1/messages/count_tokens``: ``model``, ``messages``, ``system``, ``tools``, ``tool_choice``, ``thinking``."""

    model: Any = Field("", validate_default=True)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> str:
        return checked_model(v)

    @model_validator(mode="after")
    def _named_tool_exists(self):
        tc = self.tool_choice
        if tc is not None and tc.type in ("any", "tool") and not self.client_tools():
            raise OptionError(f'tool_choice "{tc.type}" needs tools', hint="send the tools, or leave tool_choice out")
        if tc is not None and tc.type == "tool" and tc.name not in {t.name for t in self.client_tools()}:
            raise OptionError(f"tool_choice names {tc.name!r}, which is not in tools")
        return self

    def client_tools(self) -> list[ToolParam]:
        """The tools the model may call (server tools left out, with a debug log)."""
        out = []
        for t in self.tools or ():
            if t.is_client_tool:
                out.append(t)
            else:
                log.debug("/v1/messages: server tool %r (type %s) ignored", t.name, t.type)
        return out

    @property
    def system_text(self) -> str:
        """``system`` as one string (text blocks joined by blank lines)."""
        if self.system is None:
            return ""
        return self.system if isinstance(self.system, str) else "\n\n".join(b.text for b in self.system)

    def chat_messages(self) -> list[dict]:
        """The conversation as the chat messages templates take: ``system`` first (a ``system`` turn stays where it
        is, as a system message); a user's ``tool_result`` blocks
        become ``tool`` messages (before the user's text); an assistant's ``tool_use`` blocks its ``tool_calls``
        and its ``thinking`` blocks its ``thinking``."""
        out: list[dict] = [{"role": "system", "content": self.system_text}] if self.system_text else []
        for m in self.messages:
            texts, calls, thinking, images = [], [], [], []
            for b in m.content:
                if m.role == "system" and not isinstance(b, TextBlock):
                    raise OptionError("system messages hold text blocks only")
                if isinstance(b, TextBlock):
                    texts.append(b.text)
                elif isinstance(b, ToolResultBlock):
                    if m.role != "user":
                        raise OptionError("tool_result blocks belong in user messages")
                    out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text})
                elif isinstance(b, ToolUseBlock):
                    if m.role != "assistant":
                        raise OptionError("tool_use blocks belong in assistant messages")
                    calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}})
                elif isinstance(b, ThinkingBlock) and m.role == "assistant":
                    thinking.append(b.thinking)
                elif isinstance(b, ImageBlock):
                    images.append({"type": "image", "source": b.source.model_dump(exclude_none=True)})

            msg: dict = {"role": m.role, "content": "".join(texts)}
            if images:  # read by the prompt builder (server.generation), which decodes them for a vision model
                msg["content"] = [{"type": "text", "text": "".join(texts)}, *images]
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["thinking"] = "".join(thinking)
            if texts or calls or images or m.role != "user":
                out.append(msg)
        return read_history(out)

    def openai_tools(self) -> list[dict] | None:
        """The client tools in the shape the tool machinery takes (``{"type": "function", "function": {name,
        description, parameters}}``); None when there are none."""
        tools = [{"type": "function", "function": {"name": t.name, **({"description": t.description} if t.description
                                                                       else {}),
                                                   "parameters": t.input_schema or {"type": "object", "properties": {}}}}
                 for t in self.client_tools()]
        return tools or None

    @property
    def choice(self) -> tuple[str, str | None]:
        """``tool_choice`` as the generation path's ``(mode, name)``: auto, none, required (``any``) or
        ``("required", NAME)`` (``tool``)."""
        tc = self.tool_choice
        if tc is None or tc.type == "auto":
            return "auto", None
        if tc.type == "none":
            return "none", None
        return "required", tc.name if tc.type == "tool" else None

    @property
    def think(self) -> bool | str | None:
        """The think level ``thinking`` asks for (None when absent)."""
        return None if self.thinking is None else self.thinking.think


class MessagesBody(CountTokensBody):
    """``/v1/messages``: :class:`CountTokensBody` plus ``max_tokens`` (required, >= 0), ``stop_sequences``,
    ``temperature``, ``top_p``, ``top_k``, ``metadata`` (accepted, not used), ``stream``, and as an ollapy
    extension Ollama's ``options`` object and ``keep_alive``."""

    max_tokens: int = Field(ge=0)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    stream: bool = False
    options: dict[str, Any] | None = None
    keep_alive: Any = None

    def ollama_options(self) -> dict:
        """Ollama options: ``max_tokens`` → ``num_predict``, ``stop_sequences`` → ``stop``, the sampling fields,
        then ``options``."""
        opts: dict[str, Any] = {"num_predict": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                opts[name] = getattr(self, name)
        if self.stop_sequences:
            opts["stop"] = list(self.stop_sequences)
        opts.update(self.options or {})
        return opts

    @property
    def parallel_tool_calls(self) -> bool:
        """False when ``tool_choice.disable_parallel_tool_use`` asks for at most one call."""
        return not (self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use)


def tool_input_json(arguments: dict) -> str:
    """A call's ``input`` as the JSON text an ``input_json_delta`` carries."""
    return json.dumps(arguments, ensure_ascii=False)
