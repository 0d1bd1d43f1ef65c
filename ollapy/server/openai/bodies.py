"""Request bodies of the OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/completions``).

Read as :mod:`ollapy.server.ollama.bodies` reads every body (null = absent, one-line
errors, never a 422); sampling fields are mapped to Ollama options.
"""
from __future__ import annotations

import reprlib
from typing import Any, ClassVar

from pydantic import Field, field_validator

from ollapy.errors import OptionError
from ollapy.server.bodies import Body, LogprobsBody, ToolsBody, checked_model, read_history, read_think

# ---- OpenAI (/v1) ---------------------------------------------------------------------------------

def read_effort(value: Any, field: str) -> Any:
    """A think level from OpenAI's ``reasoning_effort`` (a string) or ``reasoning`` (``{"effort": ...}``); None
    for a ``reasoning`` object without one. Raises OptionError for a level not in :data:`REASONING_EFFORTS`."""
    effort = value.get("effort") if field == "reasoning" and isinstance(value, dict) else value
    if field == "reasoning" and effort is None:
        return None
    if not isinstance(effort, str) or effort not in REASONING_EFFORTS:  # a list or object is no level (nor hashable)
        raise OptionError(f"invalid {field} value {reprlib.repr(effort)}", hint='use "high", "medium", "low" or "none"')
    return effort

LLAMA_SERVER_SAMPLING = ("top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "dry_multiplier",
                         "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
                         "top_n_sigma", "xtc_probability", "xtc_threshold")
"""Sampling fields llama.cpp's server reads at the top level of an OpenAI body (``tools/server/server-schema.cpp``),
beyond OpenAI's own: each is the Ollama option of the same name."""


class StreamOptions(Body):
    """OpenAI's ``stream_options``: ``include_usage`` adds a last chunk with ``usage``."""

    include_usage: bool = False


class OpenAIBody(Body):
    """What ``/v1/chat/completions`` and ``/v1/completions`` share: the model, sampling fields (OpenAI's,
    ``logit_bias`` and llama-server's :data:`LLAMA_SERVER_SAMPLING`, mapped to Ollama options by
    :meth:`ollama_options`), ``response_format`` (read as a format: None, ``"json"`` or a
    JSON schema), ``keep_alive``, ``stream`` (default false) and ``stream_options``."""

    SAMPLING: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                                           "logit_bias", *LLAMA_SERVER_SAMPLING)

    model: Any = Field("", validate_default=True)
    max_completion_tokens: Any = None
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    seed: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    # llama-server's sampling fields, top level in its /v1 bodies (Ollama's option names where they exist)
    top_k: Any = None
    min_p: Any = None
    typical_p: Any = None
    repeat_penalty: Any = None
    repeat_last_n: Any = None
    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_penalty_last_n: Any = None
    dry_sequence_breakers: Any = None
    top_n_sigma: Any = None
    xtc_probability: Any = None
    xtc_threshold: Any = None
    stop: Any = None
    n: Any = None
    options: Any = None  # ollapy/Ollama extension, used when it is an object
    response_format: Any = None
    keep_alive: Any = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> str:
        return checked_model(v)

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: Any, info) -> Any:
        """OpenAI's range, [-2, 2] (its API answers a 400 outside it); other types are checked as options."""
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not -2.0 <= v <= 2.0:
            raise OptionError(f"{info.field_name} must be between -2 and 2, got {v}")
        return v

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: Any) -> Any:
        if v not in (None, 1):
            raise OptionError("n must be 1", hint="ollapy returns one choice per request")
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, rf: Any) -> Any:
        if rf == {}:
            return None
        if not isinstance(rf, dict):
            raise OptionError("response_format must be an object")
        kind = rf.get("type")
        if kind in (None, "text"):
            return None
        if kind == "json_object":
            return "json"
        if kind == "json_schema":
            js = rf.get("json_schema") or {}
            schema = js.get("schema") if isinstance(js, dict) else None
            if not isinstance(schema, dict):
                raise OptionError("response_format.json_schema.schema must be a JSON schema object")
            return schema
        raise OptionError(f"unsupported response_format type {kind!r}", hint="use text, json_object or json_schema")

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def ollama_options(self) -> dict:
        """Ollama options from the sampling fields (``max_completion_tokens`` or ``max_tokens`` → ``num_predict``,
        ``stop`` string or list), then ``options``; values are validated later by ``api_options``."""
        opts: dict[str, Any] = {}
        mt = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if mt is not None:
            opts["num_predict"] = mt
        for name in self.SAMPLING:
            value = getattr(self, name)
            if value is not None and not (name == "logit_bias" and value in ({}, [])):  # {}: no bias, as OpenAI
                opts[name] = value
        if self.stop is not None:
            opts["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if isinstance(self.options, dict):
            opts.update(self.options)
        return opts


REASONING_EFFORTS = {"xhigh": "high", "high": "high", "medium": "medium", "low": "low", "minimal": "low", "none": False}
"""OpenAI's reasoning efforts as ``think`` values: xhigh is high, minimal is low, none is off."""


class ChatCompletionBody(OpenAIBody, LogprobsBody, ToolsBody):
    """``/v1/chat/completions``: ``messages`` (non-empty; the ``developer`` role read as ``system``, as llama.cpp's
    server does; tool parts by :func:`read_history`), ``logprobs``/``top_logprobs`` (:attr:`logprob_count`),
    ``tools``, ``tool_choice`` (:attr:`choice`), ``parallel_tool_calls``, and thinking as ``reasoning_effort``,
    ``reasoning.effort`` (as Ollama's /v1: ``none`` turns it off) or Ollama's ``think`` (:attr:`think_value`)."""

    messages: Any = Field(None, validate_default=True)
    parallel_tool_calls: bool = True
    reasoning_effort: Any = None
    reasoning: Any = None
    think: Any = None

    _think = field_validator("think")(classmethod(lambda cls, v: read_think(v)))

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: Any) -> list:
        if not isinstance(v, list) or not v:
            raise OptionError("messages must be a non-empty list")
        return read_history([{**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m
                             for m in v])

    _effort = field_validator("reasoning_effort", "reasoning")(classmethod(lambda cls, v, info: read_effort(v, info.field_name)))

    @property
    def think_value(self) -> bool | str | None:
        """The ``think`` this request asks for: ``think``, else ``reasoning.effort``, else ``reasoning_effort``."""
        if self.think is not None:
            return self.think
        effort = self.reasoning or self.reasoning_effort
        return None if effort is None else REASONING_EFFORTS[effort]



class CompletionBody(OpenAIBody):
    """``/v1/completions``: ``prompt`` (a non-empty string, or a list of one), ``suffix`` (the text after the
    insertion point: a fill-in-the-middle completion) and the legacy ``logprobs`` (null, or 0..5 alternatives per
    token: :attr:`logprob_count`)."""

    prompt: Any = Field("", validate_default=True)
    suffix: Any = None
    logprobs: Any = None

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: Any) -> str:
        if v is None:
            return ""
        if not isinstance(v, str):
            raise OptionError("suffix must be a string", hint="send the text after the insertion point")
        return v

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> str:
        if isinstance(v, list):
            if len(v) != 1 or not isinstance(v[0], str):
                raise OptionError("prompt must be a string or a list of one string")
            v = v[0]
        if not isinstance(v, str) or not v:
            raise OptionError("prompt must be a non-empty string")
        return v

    @field_validator("logprobs")
    @classmethod
    def _legacy_logprobs(cls, n: Any) -> Any:
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 5:
            raise OptionError(f"logprobs must be an integer from 0 to 5, got {n!r}")
        return n

    @property
    def logprob_count(self) -> int:
        """-1 (none) or how many alternatives each token's logprobs carry."""
        return -1 if self.logprobs is None else self.logprobs
