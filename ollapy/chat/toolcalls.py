"""Tool calls out of model text: one parser per output family, whole-text and streaming.

Families (what the model writes when it calls a tool):

``hermes``  (Hermes function-calling format, used by Qwen 2.5/3 and many fine-tunes)
    ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, one tag per call, text may
    come before, between and after the tags; also the same call object in a Markdown fence or
    bare, as these models really write it (:mod:`ollapy.chat.hermes`).
``llama3``  (Meta's Llama 3.1+ model card, "JSON based tool calling")
    the whole answer is ``{"name": "f", "parameters": {...}}`` (``"arguments"`` accepted too),
    optionally after ``<|python_tag|>``; several calls are separated by ``;`` or newlines.
``mistral`` (Mistral's tokenizer docs / mistral-common)
    ``[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "abcDEF123"}, ...]`` (v3 tokenizers)
    or ``[TOOL_CALLS]f[ARGS]{...}`` repeated (v11+ tokenizers; an optional ``[CALL_ID]id`` may
    sit between the name and ``[ARGS]``).
``generic`` (the JSON forms Ollama's tool-call parsing accepts)
    a bare object with ``name`` + ``arguments``/``parameters``, a list of such objects,
    ``{"tool_calls": [...]}`` or ``{"function": {"name": ..., "arguments": ...}}``.

In every family ``arguments`` may be a JSON object or a string holding one (:mod:`ollapy.chat.calljson`
reads call objects). Malformed or partial output never raises: it comes back as content.

The whole-text parser (:func:`parse_tool_calls`) is the streaming parser
(:class:`ToolCallParser`) fed once and finished, so both agree on every input by
construction; the tests check that any split of the text gives the same result.
This module knows nothing of HTTP, terminals or llama_cpp.
"""
from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ollapy.chat.calljson import SEPARATORS, Raw, calls_from, json_sequence, one_call, raw_decode
from ollapy.chat.hermes import HERMES_TAG, split_calls
from ollapy.errors import OptionError

log = logging.getLogger(__name__)

FAMILIES = ("hermes", "llama3", "mistral", "generic")
_ALIASES = {"qwen": "hermes", "llama": "llama3", "llama3.1": "llama3", "json": "generic"}

PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9_\-]+")


@dataclass(frozen=True)
class ToolCall:
    """One tool call: function ``name``, ``arguments`` (a JSON object as a dict) and ``id``.

    ``id`` is ``None`` unless ids were requested from the parser (``ids=True``).
    """

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass
class ToolCallResult:
    """Text outside the calls (``content``, unchanged, may be empty) and the ``calls`` in order."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


def normalize_family(name: str) -> str:
    """Check a family name (or alias ``qwen``, ``llama``, ``json``) and return the canonical one.

    Raises :class:`~ollapy.errors.OptionError` for an unknown name.
    """
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FAMILIES:
        raise OptionError(f"unknown tool-call format {name!r}", "use one of: " + ", ".join(FAMILIES))
    return key


def detect_family(template: str | None, override: str | None = None) -> str:
    """Guess the tool-call family from a chat template's text (Jinja or Go), or use ``override``.

    ``<tool_call>`` -> ``hermes``; ``[TOOL_CALLS]`` -> ``mistral``; ``<|python_tag|>``,
    an ``ipython`` role or a quoted ``"parameters"`` key -> ``llama3``; otherwise ``generic``.
    ``override`` (e.g. from a Modelfile) wins and is checked with :func:`normalize_family`.
    """
    if override:
        return normalize_family(override)
    text = template or ""
    if HERMES_TAG in text:
        return "hermes"
    if MISTRAL_CALLS in text:
        return "mistral"
    if PYTHON_TAG in text or "ipython" in text or '"parameters"' in text:
        return "llama3"
    return "generic"


def call_id_factory(seed: int | None = None) -> Callable[[], str]:
    """Return a function making ids ``call_<8 hex digits>``; with ``seed`` the sequence is fixed."""
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    return lambda: f"call_{rng.getrandbits(32):08x}"


# ---------------------------------------------------------------- helpers


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker`` (to hold back)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _skip_blank(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


# ---------------------------------------------------------------- the parser


class ToolCallParser:
    """Streaming tool-call parser for one family: ``feed`` pieces, then ``finish`` once.

    ``feed(piece)`` and ``finish()`` return ``(content_delta, calls)``: the text known to be
    content so far and the calls completed by this piece. Text that may be the start of a
    call (``<tool_call>``, ``[TOOL_CALLS]``; for ``hermes`` also a fence or a call object) is
    held back until it is decided, as a stop-string matcher does, and released unchanged when
    it is not a call. For the JSON-only families (``llama3``, ``generic``) the
    decision is made at the start: if the first non-blank character is ``{`` or ``[`` (or
    the text starts with ``<|python_tag|>``) everything is buffered until ``finish``,
    otherwise it streams straight through as content.

    ``ids=True`` gives every call an id (the model's own when it wrote one, e.g. Mistral,
    else ``call_<8 hex>``; ``seed`` makes them reproducible). ``tool_names``, when given,
    accepts only calls to those functions; others stay content. Never raises on model text;
    an unknown ``family`` raises :class:`~ollapy.errors.OptionError`.
    """

    def __init__(
        self,
        family: str = "generic",
        *,
        ids: bool = False,
        seed: int | None = None,
        tool_names: Iterable[str] | None = None,
    ) -> None:
        self.family = normalize_family(family)
        self._names = frozenset(tool_names) if tool_names is not None else None
        self._new_id = call_id_factory(seed) if ids else None
        self._buf = ""
        self._state = "start" if self.family in ("llama3", "generic") else "text"
        self._after_call = False  # hermes: the text so far ends with a call (blanks after it are dropped)
        self._finished = False

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Add generated text; return ``(content_delta, completed_calls)``."""
        if self._finished:
            raise RuntimeError("ToolCallParser.feed after finish")
        self._buf += piece
        return self._step(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of output: flush held-back text, decide unclosed calls; ``(content_delta, calls)``."""
        if self._finished:
            return "", []
        out = self._step(final=True)
        self._finished = True
        return out

    # -- internals

    def _step(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self.family in ("llama3", "generic"):
            content, raw = self._step_json(final)
        elif self.family == "hermes":
            content, raw = self._step_hermes(final)
        else:
            content, raw = self._step_mistral(final)
        return content, [self._finish_call(r) for r in raw]

    def _finish_call(self, raw: Raw) -> ToolCall:
        name, args, model_id = raw
        call_id = None
        if self._new_id is not None:
            call_id = model_id or self._new_id()
        return ToolCall(name, args, call_id)

    def _step_json(self, final: bool) -> tuple[str, list[Raw]]:
        """llama3 / generic: decide at the first non-blank character, buffer JSON to the end."""
        if self._state == "start":
            head = self._buf.lstrip()
            tagged = self.family == "llama3"
            if not head or (tagged and len(head) < len(PYTHON_TAG) and PYTHON_TAG.startswith(head)):
                if not final:
                    return "", []
                self._state = "content"
            elif head[0] in "{[" or (tagged and head.startswith(PYTHON_TAG)):
                self._state = "json"
            else:
                self._state = "content"
        if self._state == "content":
            out, self._buf = self._buf, ""
            return out, []
        if not final:
            return "", []
        text, self._buf = self._buf, ""
        body = text.lstrip()
        if self.family == "llama3" and body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):]
        calls, end = json_sequence(body, True, self._names)
        if not calls:
            log.debug("tool calls: %s output is not a tool call, kept as content: %.80r", self.family, text)
            return text, []
        return body[end:].lstrip(SEPARATORS), calls

    def _step_hermes(self, final: bool) -> tuple[str, list[Raw]]:
        """hermes: tags, fences and bare call objects (:func:`ollapy.chat.hermes.split_calls`)."""
        content, calls, self._buf, self._after_call = split_calls(self._buf, final, self._names, self._after_call)
        return content, calls

    def _step_mistral(self, final: bool) -> tuple[str, list[Raw]]:
        """mistral: stream text, hold back a partial ``[TOOL_CALLS]``, parse each call body."""
        marker = MISTRAL_CALLS
        out: list[str] = []
        calls: list[Raw] = []
        while True:
            if self._state == "text":
                i = self._buf.find(marker)
                if i < 0:
                    cut = len(self._buf) - (0 if final else _partial_suffix(self._buf, marker))
                    out.append(self._buf[:cut])
                    self._buf = self._buf[cut:]
                    break
                out.append(self._buf[:i])
                self._buf = self._buf[i + len(marker):]
                self._state = "call"
                continue
            got = self._mistral_body(final)
            if got is None:  # incomplete: wait for more text
                break
            found, used = got
            self._state = "text"
            if found is None:  # malformed: the marker was just text
                log.debug("tool calls: malformed %s call kept as content: %.80r", self.family, self._buf)
                out.append(marker)
                continue
            calls.extend(found)
            self._buf = self._buf[used:]
        return "".join(out), calls

    def _mistral_body(self, final: bool) -> tuple[list[Raw] | None, int] | None:
        """After ``[TOOL_CALLS]``: a JSON list/object, or ``name[CALL_ID]id[ARGS]{...}``."""
        buf = self._buf
        wait = None if not final else (None, 0)
        p = _skip_blank(buf, 0)
        if p == len(buf):
            return wait
        if buf[p] in "[{":
            try:
                value, end = raw_decode(buf, p)
            except ValueError:
                return wait
            calls = calls_from(value, False, self._names)
            return (calls, end) if calls else (None, 0)
        m = _NAME.match(buf, p)
        if m is None:
            return None, 0
        name, q = m.group(), m.end()
        call_id = None
        if buf.startswith(MISTRAL_CALL_ID, q):
            m_id = _ID.match(buf, q + len(MISTRAL_CALL_ID))
            if m_id is None:
                return wait if q + len(MISTRAL_CALL_ID) == len(buf) else (None, 0)
            call_id, q = m_id.group(), m_id.end()
        if q == len(buf):
            return wait
        if not buf.startswith(MISTRAL_ARGS, q):
            rest = buf[q:]
            maybe = MISTRAL_ARGS.startswith(rest) or (call_id is None and MISTRAL_CALL_ID.startswith(rest))
            return wait if maybe else (None, 0)
        a = _skip_blank(buf, q + len(MISTRAL_ARGS))
        if a == len(buf):
            return wait
        if buf[a] != "{":
            return None, 0
        try:
            value, end = raw_decode(buf, a)
        except ValueError:
            return wait
        call = one_call({"name": name, "arguments": value, "id": call_id}, False, self._names)
        return ([call], end) if call else (None, 0)


def parse_tool_calls(
    text: str,
    family: str = "generic",
    *,
    ids: bool = False,
    seed: int | None = None,
    tool_names: Iterable[str] | None = None,
) -> ToolCallResult:
    """Split a whole model output into content and tool calls for ``family``.

    Same options and rules as :class:`ToolCallParser` (it is that parser fed once). Never
    raises on model text; an unknown ``family`` raises :class:`~ollapy.errors.OptionError`.
    """
    parser = ToolCallParser(family, ids=ids, seed=seed, tool_names=tool_names)
    content, calls = parser.feed(text)
    tail, more = parser.finish()
    return ToolCallResult(content + tail, calls + more)


def tool_function(tool: Any) -> dict:
    """The ``function`` object of one tool (``{"type": "function", "function": {"name", ...}}``); ``{}`` for
    anything else."""
    return tool["function"] if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else {}


def selected_functions(tools: list[dict], name: str | None) -> list[dict]:
    """The ``function`` objects of ``tools``; only the one called ``name`` when given (a forced
    ``tool_choice``). Raises OptionError when ``name`` is given and no tool has it."""
    fns = [tool_function(t) for t in tools]
    if name is not None:
        fns = [f for f in fns if f.get("name") == name]
        if not fns:
            raise OptionError(f"tool_choice names function {name!r}, which is not in tools",
                              hint="name one of the functions the request's tools define")
    return fns
