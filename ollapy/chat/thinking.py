"""Reasoning ("thinking") split from the answer, for models with a ``<think>…</think>`` section.

Two shapes of output are handled:

* the model opens the section itself (Qwen3, QwQ, SmolLM3…): ``<think>reasoning</think>answer``;
  the opening tag counts only at the start of the output (after blanks), as in Ollama;
* the chat template already opened it in the generation prompt (DeepSeek-R1 style, the
  rendered prompt ends with ``<think>``): the output starts inside the reasoning and only
  ``</think>`` appears. Pass ``opened=True`` (see :func:`prompt_opens_thinking`).

Blanks right after ``<think>`` and ``</think>`` and right before ``</think>`` are dropped.
Everything after ``</think>`` is answer. Partial tags split across streamed pieces are held
back until decided. Also here: :func:`supports_thinking` for templates, and
:func:`parse_think` for the ``think`` values Ollama accepts. No HTTP, terminal or llama_cpp.
"""
from __future__ import annotations

from dataclasses import dataclass

from ollapy.errors import OptionError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_LEVELS = ("high", "medium", "low")


def supports_thinking(template_text: str | None) -> bool:
    """True when a chat template can produce a thinking section.

    That is: the template mentions ``<think>``, ``enable_thinking`` (Qwen3's switch) or
    ``reasoning_content`` (the field some templates render past reasoning from).
    """
    text = template_text or ""
    return any(key in text for key in (THINK_OPEN, "enable_thinking", "reasoning_content"))


def prompt_opens_thinking(prompt: str) -> bool:
    """True when a rendered prompt ends inside an opened ``<think>`` (DeepSeek-R1 style)."""
    return prompt.rstrip().endswith(THINK_OPEN)


def parse_think(value: object) -> bool | str | None:
    """Validate a ``think`` value: ``True``/``False``, ``"high"``/``"medium"``/``"low"`` or None.

    Strings ``"true"``/``"false"`` (any case, e.g. from a CLI flag or Modelfile) become bools;
    levels come back lower-case; ``None`` means "not set". Anything else raises
    :class:`~ollapy.errors.OptionError` with a one-line message.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in ("true", "false"):
            return key == "true"
        if key in THINK_LEVELS:
            return key
    raise OptionError(f"invalid think value {value!r}", 'use true, false, "high", "medium" or "low"')


def think_enabled(value: bool | str | None) -> bool:
    """Whether a validated ``think`` value asks for thinking (any level counts as on)."""
    return value is True or value in THINK_LEVELS


@dataclass
class ThinkingResult:
    """Reasoning text (``thinking``, may be empty) and the answer (``content``)."""

    thinking: str
    content: str


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ThinkingParser:
    """Streaming splitter: ``feed`` pieces, then ``finish`` once.

    Both return ``(thinking_delta, content_delta)``. ``opened=True`` when the prompt already
    opened ``<think>`` (a repeated ``<think>`` at the start of the output is then swallowed).
    Output without a leading ``<think>`` (and not ``opened``) is all content, unchanged;
    an unclosed section at the end is all thinking. Never raises on model text.
    """

    def __init__(self, *, opened: bool = False) -> None:
        self._opened = opened
        self._buf = ""
        self._state = "start"
        self._skip_blank = False
        self._finished = False

    def feed(self, piece: str) -> tuple[str, str]:
        """Add generated text; return ``(thinking_delta, content_delta)``."""
        if self._finished:
            raise RuntimeError("ThinkingParser.feed after finish")
        self._buf += piece
        return self._step(final=False)

    def finish(self) -> tuple[str, str]:
        """End of output: flush what was held back; ``(thinking_delta, content_delta)``."""
        if self._finished:
            return "", ""
        out = self._step(final=True)
        self._finished = True
        return out

    def _step(self, final: bool) -> tuple[str, str]:
        thinking: list[str] = []
        content: list[str] = []
        if self._state == "start":
            head = self._buf.lstrip()
            if not final and (not head or (len(head) < len(THINK_OPEN) and THINK_OPEN.startswith(head))):
                return "", ""
            if head.startswith(THINK_OPEN):
                self._buf, self._state = head[len(THINK_OPEN):], "thinking"
            elif self._opened:
                self._buf, self._state = head, "thinking"
            else:
                self._state = "content"
            self._skip_blank = self._state == "thinking"
        if self._skip_blank:
            self._buf = self._buf.lstrip()
            self._skip_blank = not self._buf
        if self._state == "thinking":
            i = self._buf.find(THINK_CLOSE)
            if i >= 0:
                thinking.append(self._buf[:i].rstrip())
                self._buf = self._buf[i + len(THINK_CLOSE):].lstrip()
                self._state, self._skip_blank = "content", not self._buf
            elif final:
                thinking.append(self._buf.rstrip())
                self._buf = ""
            else:
                head = self._buf[: len(self._buf) - _partial_suffix(self._buf, THINK_CLOSE)].rstrip()
                thinking.append(head)
                self._buf = self._buf[len(head):]
        if self._state == "content":
            content.append(self._buf)
            self._buf = ""
        return "".join(thinking), "".join(content)


def split_thinking(text: str, *, opened: bool = False) -> ThinkingResult:
    """Split a whole output into reasoning and answer (same rules as :class:`ThinkingParser`)."""
    parser = ThinkingParser(opened=opened)
    t1, c1 = parser.feed(text)
    t2, c2 = parser.finish()
    return ThinkingResult(t1 + t2, c1 + c2)
