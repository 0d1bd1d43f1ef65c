"""Request-body bases every API's bodies share: parsing, the model field, tools, history and ``think``.

Every body is read as Ollama's server reads JSON: unknown top-level fields are
ignored and a ``null`` value counts as absent (the field's default). A bad
value raises one of ollapy's errors with a one-line message naming the field
(status 400), never FastAPI's automatic 422: the routes parse with
:meth:`Body.from_dict` inside their own ``try`` and answer in their API's error
shape. Fields that need Ollama's or OpenAI's exact semantics stay ``Any`` and
are read by a validator (``options`` by :func:`ollapy.options.api_options`
where a generation starts, so that Ollama's leniency holds there). Each API's
own bodies are in its package: :mod:`ollapy.server.ollama.bodies`,
:mod:`ollapy.server.openai.bodies`, :mod:`ollapy.server.openai.responses.bodies`,
:mod:`ollapy.server.anthropic.bodies`.
"""
from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticUndefined

from ollapy.chat.thinking import parse_think
from ollapy.errors import OptionError, UsageError
from ollapy.server import generation

MODEL_HINT = 'send {"model": "NAME", ...}'


def check_name(name: str) -> None:
    """Validate a model name (no path traversal; InvalidModelName → 400); ``*.gguf`` paths without ``..`` are allowed."""
    from ollapy.store import parse_name
    from ollapy.store.names import looks_like_path

    if looks_like_path(name) and name.lower().endswith(".gguf") and ".." not in Path(name).parts:
        return  # a GGUF file given by path (the CLI's `run ./model.gguf` through a server)
    parse_name(name)

def checked_model(v: Any, *, hint: str = MODEL_HINT, check: bool = True) -> str:
    """A request's ``model`` field, stripped: the one "model is required" rule of every API's body.

    Raises UsageError("model is required", with ``hint``) for a missing, empty or non-string value, and
    InvalidModelName (through :func:`check_name`, when ``check``) for a name that is not one."""
    if not isinstance(v, str) or not v.strip():
        raise UsageError("model is required", hint=hint)
    if check:
        check_name(v.strip())
    return v.strip()


def body_error(exc: ValidationError) -> OptionError:
    """pydantic's first validation error as one line naming the field: ``stream: input should be a valid boolean,
    got 'maybe'`` (OptionError, status 400)."""
    e = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in e.get("loc", ())) or "body"
    if e.get("type") == "missing":
        return OptionError(f"{where} is required")
    msg = "input should be an object" if e.get("type") in ("model_type", "dict_type") else e.get("msg") or "invalid value"
    msg = msg[:1].lower() + msg[1:]
    got = e.get("input", PydanticUndefined)
    return OptionError(f"{where}: {msg}" + ("" if got is PydanticUndefined else f", got {reprlib.repr(got)}"))


def refusal(field: str, message: str, error: type[UsageError] = OptionError):
    """A field validator refusing any non-empty value of ``field`` (a feature ollapy does not have) with
    ``error(message)``; ``message`` may name the body's ``{model}``."""

    def refuse(cls, v: Any, info) -> Any:
        if v:
            raise error(message.format(model=info.data.get("model")))
        return v

    return field_validator(field)(refuse)


class Body(BaseModel):
    """Base of every request body: unknown fields ignored, ``null`` read as absent."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _nulls_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @classmethod
    def from_dict(cls, data: dict):
        """The body parsed from a request's JSON object; raises OptionError/UsageError (400) with one line."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise body_error(exc) from None


class LogprobsBody(Body):
    """``logprobs`` (bool) and ``top_logprobs`` (0..20), as Ollama and OpenAI's chat API name them
    (:func:`ollapy.server.generation.logprobs_field`); :attr:`logprob_count` is what the engine takes."""

    logprobs: Any = None
    top_logprobs: Any = None
    _logprob_count: int = PrivateAttr(-1)

    @model_validator(mode="after")
    def _logprobs(self):
        self._logprob_count = generation.logprobs_field(self.logprobs, self.top_logprobs)
        return self

    @property
    def logprob_count(self) -> int:
        """-1 (none) or how many alternatives each token's logprobs carry."""
        return self._logprob_count


# ---- tools and tool-call histories (both APIs) ----------------------------------------------------
class FunctionSpec(Body):
    """A tool's function: ``name`` (required), ``description``, ``parameters`` (a JSON schema object)."""

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(Body):
    """One tool of a request: ``{"type": "function", "function": {...}}`` (the only type there is)."""

    type: str = "function"
    function: FunctionSpec

    @field_validator("type")
    @classmethod
    def _function_only(cls, v: str) -> str:
        if v != "function":
            raise OptionError(f"unsupported tool type {v!r}", hint='use "function"')
        return v


class CallFunction(Body):
    """A past call's function: ``name`` and ``arguments``, an object (Ollama) or a JSON string holding one
    (OpenAI); read as a dict."""

    name: str = Field(min_length=1)
    arguments: Any = None

    @field_validator("arguments")
    @classmethod
    def _object(cls, v: Any) -> dict:
        if isinstance(v, str):
            try:
                v = json.loads(v) if v.strip() else {}
            except ValueError:
                raise OptionError("invalid tool call arguments: not JSON",
                                  hint="send the arguments the model returned, a JSON object") from None
        if not isinstance(v, dict):
            raise OptionError("invalid tool call arguments: not a JSON object")
        return v


class HistoryCall(Body):
    """A tool call in an assistant message of the history: ``function``, optional ``id`` and ``type``."""

    id: str | None = None
    type: str | None = None
    function: CallFunction


def read_tools(v: Any) -> list[dict] | None:
    """A request's ``tools`` as plain dicts (validated :class:`ToolSpec`); None when absent or empty."""
    if not v:
        return None
    if not isinstance(v, list):
        raise OptionError("tools must be a list of function tools")
    out = []
    for i, t in enumerate(v):
        try:
            out.append(ToolSpec.model_validate(t).model_dump(exclude_none=True))
        except ValidationError as exc:
            raise _prefixed(body_error(exc), f"tools.{i}") from None
    return out


def _prefixed(exc: OptionError, where: str) -> OptionError:
    """``exc`` (a nested body's error, ``field: ...``) with ``where.`` in front of its field."""
    msg = exc.message
    return OptionError(f"{where}{msg[4:]}" if msg.startswith("body:") else f"{where}.{msg}", exc.hint)


def read_history(messages: list) -> list:
    """Chat messages with their tool parts checked: an assistant's ``tool_calls`` as
    ``[{"id"?, "type": "function", "function": {"name", "arguments": dict}}]``, and a ``tool`` message's
    ``tool_name`` from ``tool_name``, ``name`` or the call its ``tool_call_id`` answers. Other messages and
    fields pass unchanged (roles and contents are checked where the prompt is built)."""
    out, names = [], {}
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = dict(m)
        for key in ("tool_call_id", "tool_name", "name"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise OptionError(f"messages.{i}.{key} must be a string")
        if m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise OptionError(f"messages.{i}.tool_calls must be a list")
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                try:
                    calls.append(HistoryCall.model_validate(c))
                except ValidationError as exc:
                    raise _prefixed(body_error(exc), f"messages.{i}.tool_calls.{j}") from None
            m["tool_calls"] = [{**({"id": c.id} if c.id else {}), "type": "function",
                                "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls]
            names.update({c.id: c.function.name for c in calls if c.id})
        if m.get("role") == "tool" and not m.get("tool_name"):
            name = m.get("name") or names.get(m.get("tool_call_id"))
            if name:
                m["tool_name"] = name
        out.append(m)
    return out


def read_tool_choice(v: Any) -> tuple[str, str | None]:
    """OpenAI's ``tool_choice``: ``("auto"|"none"|"required", None)`` or ``("required", NAME)`` for
    ``{"type": "function", "function": {"name": NAME}}``. Raises OptionError otherwise."""
    if v is None or v == "auto":
        return "auto", None
    if v in ("none", "required"):
        return v, None
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict):
        name = v["function"].get("name")
        if isinstance(name, str) and name:
            return "required", name
    raise OptionError(f"invalid tool_choice {reprlib.repr(v)}",
                      hint='use "auto", "none", "required" or {"type": "function", "function": {"name": ...}}')


def read_think(v: Any) -> bool | str | None:
    """A request's ``think`` (true/false or a level; :func:`ollapy.chat.thinking.parse_think`)."""
    return parse_think(v)


# ---- a body naming a model --------------------------------------------------------------------------------
class NamedBody(Body):
    """A body naming a model: ``model`` (or the older ``name``); UsageError "model is required" without one.

    After parsing, ``model`` holds the name, stripped."""

    name: Any = None  # before ``model``: its validator reads it
    model: Any = Field("", validate_default=True)

    @field_validator("model", mode="before")
    @classmethod
    def _model_or_name(cls, v: Any, info) -> str:
        return checked_model(v or info.data.get("name") or "", hint=MODEL_HINT, check=False)


class ToolsBody(Body):
    """``tools`` (function tools, :func:`read_tools`; None when absent or empty) and ``tool_choice``
    (:func:`read_tool_choice`, read through :attr:`choice`): shared by ``/api/chat`` and ``/v1/chat/completions``."""

    tools: Any = None
    tool_choice: Any = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: Any) -> list[dict] | None:
        return read_tools(v)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> tuple[str, str | None]:
        return read_tool_choice(v)

    @model_validator(mode="after")
    def _choice_needs_tools(self) -> ToolsBody:
        if self.choice[0] == "required" and not self.tools:  # OpenAI: only allowed when tools are specified
            raise OptionError("tool_choice requires tools", hint="send the functions in tools, or leave tool_choice out")
        return self

    @property
    def choice(self) -> tuple[str, str | None]:
        """``(mode, function name or None)``: mode ``auto`` (the default, Ollama's only one), ``none`` or
        ``required``."""
        return self.tool_choice or ("auto", None)


