"""Lone UTF-16 surrogates in text from outside (JSON ``"\\ud800"`` escapes, undecodable command-line bytes).

Python keeps them in a ``str`` (JSON escapes become U+D800..U+DFFF; ``sys.argv`` carries undecodable bytes as
U+DC80..U+DCFF, PEP 383), but they cannot be encoded as UTF-8, so the first ``text.encode("utf-8")`` on the way to
the tokenizer raised (a 500 on every route, a crash of ``ollapy run``). Ollama's Go JSON decoder replaces each
invalid surrogate with U+FFFD (Go's ``encoding/json``: "invalid UTF-16 surrogates ... replaced"); ollapy does the
same wherever such text enters, so what the model reads is well-formed and nothing is refused.
"""
from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
# a JSON body can hold a surrogate only as an escape \uD800..\uDFFF (raw UTF-8 cannot encode one)
_ESCAPED = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def replace_surrogates(text: str) -> str:
    """``text`` with every lone surrogate (U+D800..U+DFFF) replaced by U+FFFD; the same object when it has none."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def may_hold_surrogates(raw: bytes) -> bool:
    """True when the JSON text ``raw`` has a surrogate escape (only then can its parsed strings hold one)."""
    return _ESCAPED.search(raw) is not None


def scrub_strings(value: Any) -> Any:
    """A parsed JSON value with :func:`replace_surrogates` applied to every string in it, keys included (a new
    value where anything changed; iterative, so any depth is safe)."""
    if isinstance(value, str):
        return replace_surrogates(value)
    if not isinstance(value, (list, dict)):
        return value
    root = [value]
    todo: list[tuple[Any, Any]] = [(root, 0)]
    while todo:
        parent, key = todo.pop()
        v = parent[key]
        if isinstance(v, str):
            parent[key] = replace_surrogates(v)
        elif isinstance(v, list):
            todo.extend((v, i) for i in range(len(v)))
        elif isinstance(v, dict):
            fixed = {replace_surrogates(k) if isinstance(k, str) else k: x for k, x in v.items()}
            if any(a is not b for a, b in zip(fixed, v)):
                v.clear()
                v.update(fixed)
            todo.extend((v, k) for k in list(v))
    return root[0]
