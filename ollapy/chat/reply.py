"""A model's answer split into reasoning, content and tool calls, whole or streamed; forced-call schemas.

:class:`ReplyParser` chains :class:`~ollapy.chat.thinking.ThinkingParser` (when thinking is on, or
the prompt opened a ``<think>`` section) and :class:`~ollapy.chat.toolcalls.ToolCallParser` (when
tools may be called): generated text goes in piece by piece and comes out as
:class:`ReplyDelta` pieces. The server and the CLI use it the same way.

A *forced* call (OpenAI's ``tool_choice`` ``required`` or a named function) is generated under
a grammar made from :func:`forced_call_schema`, so the whole output is one JSON object
``{"name": ..., "arguments": {...}}`` and is parsed as that call whatever the model's
own tool-call format. No HTTP, terminal or llama_cpp here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from ollapy.chat import answer_memory
from ollapy.chat.thinking import ThinkingParser, supports_thinking, think_enabled
from ollapy.chat.toolcalls import ToolCall, ToolCallParser, selected_functions, tool_function
from ollapy.errors import OptionError


@dataclass
class ReplyDelta:
    """One piece of an answer: reasoning text, answer text and the tool calls completed in it."""

    thinking: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.thinking or self.content or self.calls)

    def __add__(self, other: ReplyDelta) -> ReplyDelta:
        return ReplyDelta(self.thinking + other.thinking, self.content + other.content, self.calls + other.calls)


class CallParser(Protocol):
    """What splits answer text into content and tool calls, streaming: :class:`~ollapy.chat.toolcalls.ToolCallParser`
    (a model's own format) or :class:`~ollapy.chat.generic_tools.GenericCallParser` (llama.cpp's generic format)."""

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Add text; ``(content decided so far, calls completed)``."""
        ...

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of text: what was held back, and the calls left to decide."""
        ...


class ReplyParser:
    """Split generated text into :class:`ReplyDelta` pieces: ``feed`` each piece, then ``finish`` once.

    ``think``: split a ``<think>`` section off as reasoning. ``opened``: the prompt already opened
    it (DeepSeek-R1 style, :func:`~ollapy.chat.thinking.prompt_opens_thinking`); the output is split
    even when ``think`` is false, and the reasoning is then dropped (``thinking`` stays empty).
    ``family``: the tool-call format to parse (None: no tool calls); ``forced``: the output is
    one grammar-forced JSON call (parsed as the ``generic`` family). ``tool_names`` limits the
    functions accepted; ``ids`` gives every call an id (``seed`` makes them reproducible);
    ``max_calls`` (OpenAI's ``parallel_tool_calls: false`` is 1) keeps only the first calls parsed,
    later ones are dropped (neither calls nor content). ``calls``: a ready :class:`CallParser` to use instead
    of a family's (the generic format's, whose answer is grammar-constrained JSON: no reasoning is split off).
    ``model``: at :meth:`finish`, remember the answer as the model wrote it under this model's name
    (:mod:`ollapy.chat.answer_memory`: the next request's history holds the model's own text where the client
    sends the answer back), unless reasoning was split off, calls were dropped or the call was forced; None: not
    remembered.
    Never raises on model text: what is not a call stays content.
    """

    def __init__(self, *, think: bool = False, opened: bool = False, family: str | None = None,
                 forced: bool = False, tool_names: Iterable[str] | None = None, ids: bool = False,
                 seed: int | None = None, max_calls: int | None = None, calls: CallParser | None = None,
                 model: str | None = None) -> None:
        self.keep_thinking = think
        constrained = forced or calls is not None
        self._thinking = ThinkingParser(opened=opened) if (think or opened) and not constrained else None
        family = "generic" if forced else family
        self._tools: CallParser | None = calls
        if calls is None and family:
            self._tools = ToolCallParser(family, ids=ids, seed=seed, tool_names=tool_names)
        self.calls = 0  # tool calls so far (kept ones)
        self.max_calls = max_calls
        self._model = model if self._thinking is None and not forced else None  # whose answer to remember
        self._raw: list[str] = []  # the text fed, as generated
        self._content: list[str] = []  # what the client gets: content pieces ...
        self._kept: list[ToolCall] = []  # ... and the calls kept
        self._dropped = False  # calls dropped by max_calls
        self._finished = False

    def _after_thinking(self, thinking: str, content: str, final: bool) -> ReplyDelta:
        if not self.keep_thinking:
            thinking = ""
        calls: list[ToolCall] = []
        if self._tools is not None:
            content, calls = self._tools.feed(content)
            if final:
                tail, more = self._tools.finish()
                content, calls = content + tail, calls + more
        if self.max_calls is not None:
            kept = calls[: max(0, self.max_calls - self.calls)]
            self._dropped |= len(kept) < len(calls)
            calls = kept
        self.calls += len(calls)
        if self._model is not None:
            self._content.append(content)
            self._kept.extend(calls)
        return ReplyDelta(thinking, content, calls)

    def feed(self, text: str) -> ReplyDelta:
        """Add generated text; returns what is decided so far (text that may start a tag is held back)."""
        if self._model is not None:
            self._raw.append(text)
        thinking, content = self._thinking.feed(text) if self._thinking is not None else ("", text)
        return self._after_thinking(thinking, content, final=False)

    def finish(self) -> ReplyDelta:
        """End of output: everything held back, and calls left open decided (complete ones count)."""
        if self._finished:
            return ReplyDelta()
        self._finished = True
        thinking, content = self._thinking.finish() if self._thinking is not None else ("", "")
        out = self._after_thinking(thinking, content, final=True)
        if self._model is not None and not self._dropped:
            answer_memory.MEMORY.remember(self._model, "".join(self._raw), "".join(self._content),
                                          [(c.name, c.arguments) for c in self._kept])
        return out

    def parse(self, text: str) -> ReplyDelta:
        """A whole output at once: :meth:`feed` then :meth:`finish`."""
        return self.feed(text) + self.finish()


def supports_tools(template_text: str | None) -> bool:
    """Whether a chat template renders tool definitions: it reads ``tools`` (Ollama's ``tools`` capability;
    the same rule as :func:`ollapy.engine.backend.templating.template_mentions_tools`, without importing llama_cpp)."""
    return "tools" in (template_text or "")


def check_capabilities(name: str, *, can_think: bool, think: bool | str | None = None) -> bool | str | None:
    """Check a request's ``think`` against what the model can do, as Ollama does; return the ``think`` value
    to render with.

    ``can_think``: the model's capability (:func:`ollapy.chat.thinking.supports_thinking` of its template).
    ``think`` is a validated value (:func:`ollapy.chat.thinking.parse_think`).

    Returns: for a thinking model, ``think`` with unset meaning on (``True``); otherwise None (false is
    accepted and ignored). Raises :class:`~ollapy.errors.OptionError` with Ollama's exact words
    ``"NAME" does not support thinking`` for ``think`` true or a level on a model without it.
    Tools are not checked: a template without tool support gets llama.cpp's generic tool-call format
    (:mod:`ollapy.chat.generic_tools`) where Ollama answers "does not support tools".
    """
    if can_think:
        return True if think is None else think
    if think_enabled(think):
        raise OptionError(f'"{name}" does not support thinking')  # Ollama's words, as they are
    return None


def model_capabilities(template_text: str | None, *, embedding_only: bool) -> list[str]:
    """Ollama's ``capabilities`` list for a model: ``["embedding"]`` for an embedding-only model, else
    ``"completion"`` plus ``"tools"`` (the template reads ``tools``) and ``"thinking"`` (it has a reasoning
    section), in Ollama's order."""
    if embedding_only:
        return ["embedding"]
    caps = ["completion"]
    if supports_tools(template_text):
        caps.append("tools")
    if supports_thinking(template_text):
        caps.append("thinking")
    return caps


def tool_names(tools: Iterable[dict] | None) -> list[str]:
    """The function names of ``tools`` in order."""
    return [tool_function(t).get("name", "") for t in tools or ()]


def forced_call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON schema of one call to ``name`` (or to any of ``tools`` when None).

    ``{"name": NAME, "arguments": PARAMETERS}`` with ``name`` a ``const`` and ``arguments`` the
    function's ``parameters`` schema (any object when it has none); several functions give
    ``anyOf`` over them. Raises OptionError when ``tools`` is empty or has no function ``name``.
    """
    fns = selected_functions(tools, name)
    if not fns:
        raise OptionError("tool_choice asks for a tool call but the request has no tools", hint="send tools")

    def one(fn: dict) -> dict:
        params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else None
        return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                 "arguments": params or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}

    return one(fns[0]) if len(fns) == 1 else {"anyOf": [one(f) for f in fns]}
