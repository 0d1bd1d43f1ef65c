"""Tool calls written as JSON: one call object, a list of them, a run of them; and whether a JSON value is cut short.

A *call object* is ``{"name": "f", "arguments": {...}}`` (``"parameters"`` accepted for ``"arguments"``, which may
also be a string holding a JSON object), or ``{"function": {"name", "arguments"}}`` (OpenAI's shape); a *raw
call* is ``(name, arguments dict, id the model wrote or None)``. The tool-call parsers
(:mod:`ollapy.chat.toolcalls`, :mod:`ollapy.chat.hermes`) share these. Never raises on model text: what is not a
call is ``None``. Standard-library ``json`` only; no HTTP, terminal or llama_cpp here.
"""
from __future__ import annotations

import json
from typing import Any

DECODER = json.JSONDecoder()
"""The strict JSON decoder every parser uses (a raw control character in a string is not JSON, as in llama.cpp)."""

SEPARATORS = " \t\r\n;,"
"""What may stand between two calls of a run."""

Raw = tuple[str, dict, "str | None"]
"""A call before it gets its id: (name, arguments, id the model wrote or None)."""

MAX_DEPTH = 64
"""How deeply a call's arguments may nest (objects and lists); deeper JSON is not a call but text. A bound, so no
call reaches an encoder (``json.dumps`` recurses) nested as deep as Python's recursion limit."""

_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_TAILS = frozenset({".", "e", "E", "e+", "e-", "E+", "E-"})


def raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """:data:`DECODER`'s ``raw_decode``: ``(value, end)``. Raises ValueError for text that is not JSON, JSON
    nested too deep for the decoder (its RecursionError) included."""
    try:
        return DECODER.raw_decode(text, pos)
    except RecursionError:
        raise ValueError(f"JSON nested too deep at {pos}") from None


def loads(text: str) -> Any:
    """``json.loads``; raises ValueError for text that is not JSON, JSON nested too deep included."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def shallow(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (decoded JSON) nests objects and lists at most ``limit`` deep (checked without recursion)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= limit:
                return False
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def arguments_of(value: Any) -> dict | None:
    """Arguments as a dict: an object (at most :data:`MAX_DEPTH` deep), a JSON string holding one, or null/""
    (no arguments); None otherwise."""
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) and shallow(value) else None


def one_call(obj: Any, require_args: bool, names: frozenset[str] | None) -> Raw | None:
    """One call object (plain or ``{"function": {...}}``) as a raw call, or None when it is not a call: no
    non-blank ``name``, a name outside ``names`` (when given), arguments that are not an object, or (with
    ``require_args``) no ``arguments``/``parameters`` key."""
    if not isinstance(obj, dict):
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    src = obj["function"] if isinstance(obj.get("function"), dict) else obj
    name = src.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    if names is not None and name not in names:
        return None
    for key in ("arguments", "parameters"):
        if key in src:
            args = arguments_of(src[key])
            if args is None:
                return None
            break
    else:
        if require_args:
            return None
        args = {}
    return name, args, call_id


def calls_from(value: Any, require_args: bool, names: frozenset[str] | None) -> list[Raw] | None:
    """The raw calls in one decoded JSON value (a call object, a non-empty list of them, or
    ``{"tool_calls": [...]}``), or None when any item is not a call (:func:`one_call`)."""
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    out = []
    for item in items:
        call = one_call(item, require_args, names)
        if call is None:
            return None
        out.append(call)
    return out


def json_sequence(text: str, require_args: bool, names: frozenset[str] | None) -> tuple[list[Raw], int]:
    """Leading JSON calls of ``text`` separated by :data:`SEPARATORS`: (raw calls, end of the last one; 0 when
    none)."""
    calls: list[Raw] = []
    pos = end = 0
    while True:
        while pos < len(text) and text[pos] in SEPARATORS:
            pos += 1
        if pos >= len(text) or text[pos] not in "{[":
            return calls, end
        try:
            value, stop = raw_decode(text, pos)
        except ValueError:
            return calls, end
        got = calls_from(value, require_args, names)
        if got is None:
            return calls, end
        calls.extend(got)
        pos = end = stop


def json_value(text: str, pos: int) -> tuple[str, Any, int]:
    """Read the JSON value that starts at ``text[pos]``, a text that may still grow (a stream).

    Returns ``("done", value, end)``; ``("more", None, pos)`` when ``text[pos:]`` is a proper beginning of a
    JSON value (cut short: a later piece may complete it); ``("bad", None, pos)`` when no continuation can make
    it JSON. The decision reads the standard decoder's error: a cut-short text fails at its very end, inside an
    unterminated string, inside a ``\\uXXXX`` escape, or inside a literal (``tru``) or a number (``1.``, ``1e+``).
    JSON nested deeper than the decoder can go is ``bad`` (no call is nested so deep: :data:`MAX_DEPTH`).
    """
    try:
        value, end = DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as err:
        return ("more" if _cut_short(err, text) else "bad"), None, pos
    except RecursionError:
        return "bad", None, pos
    return "done", value, end


def _cut_short(err: json.JSONDecodeError, text: str) -> bool:
    """Whether the decoder's ``err`` on ``text`` is only the text ending too early."""
    tail = text[err.pos:]
    if not tail or err.msg.startswith("Unterminated string"):
        return True
    if err.msg == "Expecting value":
        return any(lit.startswith(tail) and lit != tail for lit in _LITERALS)
    if err.msg == "Expecting ',' delimiter":
        return tail in _NUMBER_TAILS
    if err.msg.startswith("Invalid \\uXXXX escape"):
        # 'u' and up to 3 hex digits; or a whole high surrogate waiting for its pair (\ud83d then \u...)
        hexes = "0123456789abcdefABCDEF"
        if tail[:1] == "u" and len(tail) <= 4 and all(c in hexes for c in tail[1:]):
            return True
        if len(tail) >= 5 and tail[0] == "u" and all(c in hexes for c in tail[1:5]):
            rest = tail[5:]
            return rest in ("", "\\") or (rest[:2] == "\\u" and len(rest) <= 5 and all(c in hexes for c in rest[2:]))
    return False
