"""Ollama's request bodies (``/api/*``) as pydantic models, on the shared bases of :mod:`ollapy.server.bodies`."""
from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from ollapy.errors import OptionError, UsageError
from ollapy.server import generation
from ollapy.server.bodies import (
    Body,
    LogprobsBody,
    NamedBody,
    ToolsBody,
    check_name,
    read_history,
    read_think,
    refusal,
)


class OllamaGenBody(NamedBody, LogprobsBody):
    """What ``/api/generate`` and ``/api/chat`` share: options, format, keep_alive, cache, logprobs, stream.

    ``model`` must pass :func:`check_name`. ``format``: None, ``"json"`` or a JSON schema object.
    :attr:`logprob_count` is -1 (no logprobs) or the number of alternatives per token."""

    options: Any = None  # read leniently by api_options where the generation starts
    format: Any = None
    keep_alive: Any = None
    cache: bool = True
    stream: bool = True
    think: Any = None  # True/False or "high"/"medium"/"low" (parse_think); None: the model's default
    truncate: bool | None = None  # Ollama's per-request switches; they override the options of the same names
    shift: bool | None = None

    _think = field_validator("think")(classmethod(lambda cls, v: read_think(v)))

    def run_options(self) -> Any:
        """``options`` with the top-level ``truncate`` and ``shift`` (Ollama's per-request switches: false makes a
        prompt over ``num_ctx`` a 400, or ends generation at the context's end with ``done_reason`` ``length``)
        applied over it when set."""
        switches = {k: v for k, v in (("truncate", self.truncate), ("shift", self.shift)) if v is not None}
        if not switches:
            return self.options
        return {**(self.options if isinstance(self.options, dict) else {}), **switches}

    @field_validator("model")
    @classmethod
    def _checked_name(cls, v: str) -> str:
        check_name(v)
        return v

    @field_validator("format")
    @classmethod
    def _format(cls, v: Any) -> Any:
        if v == "":
            return None
        if v == "json" or isinstance(v, dict):
            return v
        raise OptionError(f"format must be 'json' or a JSON schema object, got {v!r}")



class GenerateBody(OllamaGenBody):
    """``/api/generate``: ``prompt`` (str), ``suffix``, ``raw``, ``system``, ``context`` (token ids or None);
    ``images`` (base64 strings) go with the prompt to a vision model."""

    images: Any = None
    prompt: Any = ""
    suffix: Any = None
    raw: bool = False
    system: str | None = None
    context: Any = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> str:
        if not v:
            return ""
        if not isinstance(v, str):
            raise OptionError("prompt must be a string")
        return v

    @field_validator("context")
    @classmethod
    def _context(cls, v: Any) -> list[int] | None:
        return generation.context_field(v)

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: Any) -> str:
        if v is None or v == "":
            return ""
        if not isinstance(v, str):
            raise OptionError("suffix must be a string", hint="send the text after the cursor")
        return v


class ChatBody(OllamaGenBody, ToolsBody):
    """``/api/chat``: ``messages`` (a list, possibly empty; tool parts read by :func:`read_history`),
    ``tools`` and, as an ollapy extension, OpenAI's ``tool_choice`` (:class:`ToolsBody`)."""

    messages: Any = []

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: Any) -> list:
        v = v or []
        if not isinstance(v, list):
            raise OptionError("messages must be a list")
        return read_history(v)


class CopyBody(Body):
    """``/api/copy``: ``source`` and ``destination`` model names (both required)."""

    source: Any = None
    destination: Any = None

    @model_validator(mode="after")
    def _both(self):
        src, dst = self.source, self.destination
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            raise UsageError("source and destination are required")
        return self


class StoreNameBody(NamedBody):
    """A body naming a model of the store (pull, create, delete): ``model`` must follow the store's name rules
    (InvalidModelName, 400; no ``.gguf`` paths)."""

    @field_validator("model")
    @classmethod
    def _store_name(cls, v: str) -> str:
        from ollapy.store import parse_name

        parse_name(v)
        return v


class PullBody(StoreNameBody):
    """``/api/pull``: ``insecure`` (plain-HTTP registries), ``stream`` (default true)."""

    insecure: bool = False
    stream: bool = True


class CreateBody(StoreNameBody):
    """``/api/create``: ``from`` (or ``from_``), ``files``, the legacy ``modelfile``, and the fields that override
    it (typed as Ollama's Go struct types them); ``quantize`` and ``adapters`` are refused."""

    quantize: Any = None
    adapters: Any = None
    from_: Any = Field(None, alias="from")
    from_underscore: Any = Field(None, alias="from_")
    files: Any = None  # {file name: blob digest}, checked where the Modelfile is built
    modelfile: str | None = None
    parameters: dict[str, Any] | None = None
    license: str | list[str] | None = None
    system: str | None = None
    template: str | None = None
    messages: list[dict] | None = None
    stream: bool = True

    _no_quantize = refusal("quantize", "quantize is not supported by ollapy", UsageError)
    _no_adapters = refusal("adapters", "adapters are not supported by ollapy", UsageError)

    @property
    def source(self) -> Any:
        """The FROM the request names (``from`` or ``from_``), unchecked."""
        return self.from_ or self.from_underscore
