"""Tool calls of the Hermes 2 Pro / Qwen2.5 family, in every form these models really write, streamed.

The template asks for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; small models often write the
same call object in a Markdown fence or bare (Qwen2.5-Coder-1.5B answered Claude Code with a fenced ``json``
block). The forms read, as llama.cpp's Hermes 2 Pro parser reads them (``common_chat_parse_hermes_2_pro`` in
its ``common/chat.cpp``: an optional fence, an optional tag, a call object):

* ``<tool_call>`` + one or more call objects + ``</tool_call>`` (the template's own format; ``arguments`` may be
  left out);
* an optional fence (```` ```json ````, ```` ```xml ```` or ```` ``` ````), then an optional tag of
  :data:`TAGS`, then one or more call objects or lists of them, then the tag's closing tag and the fence's
  closing ```` ``` ````;
* a bare call object, or a list of them, anywhere in the text.

Outside ``<tool_call>`` a call object must open with a call key (:data:`HEAD_KEYS`) and carry ``arguments`` (or
``parameters``) that are an object, and must name one of the request's tools when their names are given: JSON
that is not such a call (a ``package.json``, a call to an unknown function, arguments that are not an object,
JSON that is not valid) stays text, unchanged. A closing tag or fence may be missing at the end of the output.

:func:`split_calls` is a pure function of the text seen so far: it releases the text that cannot become a call,
returns the calls completed, and holds back the rest (a possible call, undecided until more text comes or the
output ends). Every decision it makes on a beginning of the text is the one it makes on the whole text, so a
stream gives what the whole text gives, whatever its pieces. No HTTP, terminal or llama_cpp here.
"""
from __future__ import annotations

import re
from typing import Iterable

from ollapy.chat.calljson import SEPARATORS, Raw, calls_from, json_value

FENCE = "```"
FENCE_LANGS = ("json", "xml")
HERMES_TAG = "<tool_call>"
TAGS = (HERMES_TAG, "<function_call>", "<tools>", "<tool>", "<response>", "<json>", "<xml>", "<JSON>")
"""The tags a call may sit in (llama.cpp's list); ``<tool_call>`` is the template's own."""
HEAD_KEYS = ("name", "arguments", "parameters", "function", "tool_calls")
"""The keys a call object outside ``<tool_call>`` may open with."""

_START = re.compile(r"[<`{\[]")
_BLANK = " \t\r\n"


class _More(Exception):
    """The text so far may still become a call: wait for more."""


class _No(Exception):
    """The text at this position is not a call, whatever follows."""


def split_calls(text: str, final: bool, names: Iterable[str] | None = None,
                after_call: bool = False) -> tuple[str, list[Raw], str, bool]:
    """Split ``text`` (what is not yet decided of a model's output) into decided content, calls and held text.

    ``final``: the output has ended (nothing is held back then). ``names``: the tool names a call may use
    (None: any). ``after_call``: ``text`` follows a call directly (the previous result's last item).
    Blanks right after a call are dropped, as llama.cpp's parser consumes them. Returns ``(content, raw calls,
    held, after_call)``: ``content`` is the text up to the first possible call that is not decided yet, the text
    between calls included, unchanged; ``held`` is the rest, to pass again with more text after it; the last
    item says whether everything up to ``held`` after the last call was blank. Never raises on model text.
    """
    allowed = frozenset(names) if names is not None else None
    out: list[str] = []
    calls: list[Raw] = []
    start = pos = _skip_blank(text, 0) if after_call else 0
    while True:
        m = _START.search(text, pos)
        if m is None:
            out.append(text[start:])
            return "".join(out), calls, "", after_call and start == len(text)
        p = m.start()
        try:
            end, got = _Reader(text, p, final, allowed).call()
        except _No:
            pos = p + 1
            continue
        except _More:
            assert not final
            out.append(text[start:p])
            return "".join(out), calls, text[p:], after_call and start == p
        out.append(text[start:p])
        calls.extend(got)
        start = pos = _skip_blank(text, end)
        after_call = True


class _Reader:
    """Reads one possible call at ``text[p]``: :meth:`call` returns ``(end, raw calls)`` or raises
    :class:`_No` / :class:`_More` (never :class:`_More` when ``final``)."""

    def __init__(self, text: str, p: int, final: bool, names: frozenset[str] | None) -> None:
        self.text, self.i, self.final, self.names = text, p, final, names

    def undecided(self) -> Exception:
        return _No() if self.final else _More()

    def at_end(self) -> bool:
        return self.i >= len(self.text)

    def skip(self, chars: str) -> None:
        while self.i < len(self.text) and self.text[self.i] in chars:
            self.i += 1

    def starts(self, lit: str) -> bool:
        """Consume ``lit`` when the text has it here; False when it has not (raises when it may still come)."""
        rest = self.text[self.i:self.i + len(lit)]
        if rest == lit:
            self.i += len(lit)
            return True
        if len(rest) < len(lit) and lit.startswith(rest):
            raise self.undecided()
        return False

    def call(self) -> tuple[int, list[Raw]]:
        fenced = self.starts(FENCE)
        if fenced:
            for lang in FENCE_LANGS:
                if self.starts(lang):
                    break
            self.skip(_BLANK)
        tag = None
        if self.text.startswith("<", self.i):
            for t in TAGS:
                if self.starts(t):
                    tag = t
                    break
            else:
                raise _No()
            self.skip(_BLANK)
        if self.at_end():
            raise self.undecided()
        need_args = tag != HERMES_TAG
        got: list[Raw] = []
        while True:
            if self.text[self.i] not in "{[":
                raise _No()
            if need_args:
                self.check_head()
            state, value, end = json_value(self.text, self.i)
            if state == "more":
                raise self.undecided()
            calls = calls_from(value, need_args, self.names) if state == "done" else None
            if calls is None:
                raise _No()
            got.extend(calls)
            self.i = end
            if tag is None and not fenced:
                return self.stray_fence(end), got  # a bare call (or list) is decided where its JSON ends
            self.skip(SEPARATORS)
            if self.at_end():
                if self.final:
                    return self.i, got  # the closing tag or fence never came: the output ended
                raise _More()
            if self.text[self.i] not in "{[":
                break
        for closer in (["</" + tag[1:]] if tag else []) + ([FENCE] if fenced else []):
            if not self.starts(closer):
                raise _No()
            if closer != FENCE and fenced:
                self.skip(_BLANK)
                if self.at_end():
                    if self.final:
                        return self.i, got
                    raise _More()
        return self.i, got

    def stray_fence(self, end: int) -> int:
        """Where a bare call whose JSON ends at ``end`` ends: after a closing fence that follows it with no
        opening one (Qwen2.5-Coder-0.5B, after a history of calls, closes a bare call with a fence it never
        opened). Raises :class:`_More` while the text after the call is blank or a beginning of such a fence."""
        text = self.text
        i = _skip_blank(text, end)
        rest = text[i:i + len(FENCE) + 1]
        if rest == FENCE or (len(rest) < len(FENCE) and FENCE.startswith(rest)):
            if not self.final:
                raise _More()
            return end if rest != FENCE else i + len(FENCE)
        return i + len(FENCE) if rest[:len(FENCE)] == FENCE and rest[-1] in "\r\n" else end

    def check_head(self) -> None:
        """A call object outside ``<tool_call>`` opens with a call key (a list: its first item does); a first
        key ``name`` must be one of the tool names (when given). Raises :class:`_No` or :class:`_More`."""
        text, i = self.text, self.i
        if text[i] == "[":
            i = _skip_blank(text, i + 1)
            if i == len(text):
                raise self.undecided()
            if text[i] != "{":
                raise _No()
        i = _skip_blank(text, i + 1)
        if i == len(text):
            raise self.undecided()
        if text[i] != '"':
            raise _No()
        close = text.find('"', i + 1)
        if close < 0:
            partial = text[i + 1:]
            if any(k.startswith(partial) for k in HEAD_KEYS):
                raise self.undecided()
            raise _No()
        key = text[i + 1:close]
        if key not in HEAD_KEYS:
            raise _No()
        if key != "name" or self.names is None:
            return
        i = _skip_blank(text, close + 1)
        if i == len(text):
            raise self.undecided()
        if text[i] != ":":
            raise _No()
        i = _skip_blank(text, i + 1)
        if i == len(text):
            raise self.undecided()
        state, value, _ = json_value(text, i)
        if state == "more":
            raise self.undecided()
        if state == "bad" or not isinstance(value, str) or value not in self.names:
            raise _No()


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in _BLANK:
        i += 1
    return i
