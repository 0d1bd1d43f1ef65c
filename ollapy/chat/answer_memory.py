"""The answers this process generated, as the model wrote them, for the prompts of the requests that send them back.

An agent's turn is a chain of requests: the model answers with a tool call, the client runs the tool and sends the
whole conversation again with the call and its result appended. The prompt cache (and a slot's own KV) can reuse
everything up to the end of the call only when the new prompt holds the tokens the model generated. A chat
template does not write them: it renders the call in its own canonical form (Qwen2.5's template writes
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, while Qwen2.5-Coder-0.5B and -1.5B write the same
call as a ```` ```json ```` fence, the 1.5B its parallel calls as two fences; llama.cpp's generic format lets the
model choose its own spacing). So the prompt would depart from the KV cache at the first token of the call, and
the call and everything after it would be prefilled again on every step of the turn.

So this module remembers each answer whose text differs from what its parsed meaning says (a tool call, a
generic-format ``{"response": ...}``): the text exactly as generated (``raw``), under the model's
name and the answer as the client received it (its content and its calls' names and arguments). When a request's
history holds an assistant message equal to a remembered answer, :func:`written_history` puts the raw text in its
place as the message's content, with no ``tool_calls``: the template then renders the assistant header, the
model's own text and the end of the turn, which is what the model wrote after the previous prompt's generation
prompt (and the tokenizer gives the model's own tokens back for its own text: BPE merges are deterministic, and
where a model wrote a non-canonical split the slot reuses its KV up to there, still exact).

Decisions, and why:

* llama.cpp's server and Ollama keep no such memory: both render the history with the template and reuse the
  longest common token prefix with a slot's cache (llama.cpp's ``tools/server``, Ollama's ``runner`` cache), so
  an agent step there prefills from the call onwards whenever the model's writing is not the template's.
  llama.cpp's ``--cache-reuse`` (``n_cache_reuse``, its PR 9866) then moves chunks of the old KV that match again
  after the divergence to their new positions: KV computed after another prefix, not what a cold prefill computes,
  which the design's exactness rules out. Writing the model's own text into the prompt changes the prompt instead,
  never how a prompt is evaluated: a follow-up is answered as a cold request of the same token sequence answers it
  (tested in tests/test_qwen_coder.py).
* The key is the answer's meaning, not its calls' ids: ids do not survive every client (Anthropic's API sends
  ``toolu_`` ids back, older Ollama clients none), and text around the call is part of what was answered. An
  assistant message the client edited (other arguments, other text) or that this process did not generate is
  not found and is rendered by the template as before. Surrounding blanks of the content are not compared
  (clients trim them); the raw text keeps the model's own.
* Not remembered: answers whose reasoning was split off (a template renders earlier reasoning its own way, often
  dropping it), answers whose calls were cut to the first (``parallel_tool_calls: false``: the client never ran
  the rest), answers whose raw text is their content (the template renders those as written anyway), and a
  forced call (``tool_choice`` required or a named function): its bare JSON is the grammar's shape, not the
  model's own, and shown in the history it teaches the model to answer the next step in that shape (SmolLM2 then
  called again instead of answering, tests/test_tools_api.py); the template shows the model its own format, at the
  cost of prefilling that call again. The generic format's answers are remembered: their template has no format
  for calls, and the history writes JSON either way.
* A bounded LRU (:data:`ANSWER_MEMO` answers, :data:`MEMO_CHARS` characters in all), per process: after a restart,
  or once evicted, a history is rendered by the template again (a slower step, never a wrong one).

No HTTP, terminal or llama_cpp here.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Iterable

from ollapy.chat.calljson import arguments_of

ANSWER_MEMO = 512
"""How many answers the process remembers as written (the least recently used go first)."""

MEMO_CHARS = 8 << 20
"""How many characters of raw text and keys the memory holds in all; a longer answer is not remembered."""

Key = tuple[str, str, str]
"""(model name, content with surrounding blanks removed, the calls' names and arguments as canonical JSON)."""


def answer_key(model: str, content: str | None, calls: Iterable[tuple[str, Any]]) -> Key | None:
    """The key of an answer of ``model`` with ``content`` and ``calls`` (``(name, arguments)`` pairs, arguments a
    dict or a JSON string holding one); None when a call's arguments are not an object."""
    canon = []
    for name, args in calls:
        args = arguments_of(args)
        if args is None or not isinstance(name, str):
            return None
        canon.append([name, args])
    try:
        text = json.dumps(canon, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return model, (content or "").strip(), text


class AnswerMemory:
    """A bounded LRU of raw answers by :data:`Key`: at most ``entries`` answers and ``chars`` characters (raw text
    plus key) in all. Thread-safe (the server's routes and its executor threads share one)."""

    def __init__(self, entries: int = ANSWER_MEMO, chars: int = MEMO_CHARS) -> None:
        assert entries > 0 and chars > 0
        self.entries, self.chars = entries, chars
        self._items: OrderedDict[Key, str] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size(key: Key, raw: str) -> int:
        return len(raw) + sum(len(k) for k in key)

    def remember(self, model: str, raw: str, content: str, calls: Iterable[tuple[str, Any]]) -> bool:
        """Remember ``raw``, the text ``model`` generated for an answer that reached the client as ``content`` and
        ``calls``. Returns whether it was kept (not when the raw text is the content itself, or too long)."""
        calls = list(calls)
        if not calls and raw == content:
            return False
        key = answer_key(model, content, calls)
        if key is None:
            return False
        size = self._size(key, raw)
        if size > self.chars:
            return False
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= self._size(key, old)
            self._items[key] = raw
            self._held += size
            while len(self._items) > self.entries or self._held > self.chars:
                k, v = self._items.popitem(last=False)
                self._held -= self._size(k, v)
        return True

    def recall(self, model: str, message: dict) -> str | None:
        """The raw text of an assistant ``message`` of a history (``content``, ``tool_calls`` as
        ``[{"function": {"name", "arguments"}}]``) when this process generated it for ``model``; None otherwise
        (another role, reasoning or images attached, an answer not remembered)."""
        if message.get("role") != "assistant" or message.get("thinking") or message.get("images"):
            return None
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            return None
        calls = []
        for c in message.get("tool_calls") or ():
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict):
                return None
            calls.append((fn.get("name"), fn.get("arguments")))
        key = answer_key(model, content, calls)
        if key is None:
            return None
        with self._lock:
            raw = self._items.get(key)
            if raw is not None:
                self._items.move_to_end(key)
            return raw

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


MEMORY = AnswerMemory()
"""The process's memory, written by :class:`ollapy.chat.reply.ReplyParser` (given a model name) and read by
:func:`written_history`."""


def written_history(messages: list[dict], model: str, memory: AnswerMemory = MEMORY) -> list[dict]:
    """``messages`` with every assistant message that this process generated for ``model`` replaced by
    ``{"role": "assistant", "content": RAW}``, the text as the model wrote it (its calls and text inside it);
    the other messages unchanged (the same objects)."""
    out = []
    for m in messages:
        raw = memory.recall(model, m) if m.get("role") == "assistant" else None
        out.append(m if raw is None else {"role": "assistant", "content": raw})
    return out
