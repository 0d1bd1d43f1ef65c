"""Chat-template rendering (llama-cpp-python's sandboxed Jinja2 formatter) and JSON grammars (GBNF).

Tools and tool-call histories reach the template in the shape Hugging Face chat templates
expect (OpenAI's): ``tools`` as ``[{"type": "function", "function": {...}}]``, an assistant
message's ``tool_calls`` as ``[{"id", "type": "function", "function": {"name", "arguments"}}]``
and ``tool`` messages with ``tool_call_id`` and ``name``. ``arguments`` is a dict that also
acts as its JSON text (:class:`JSONArguments`), so templates that ``tojson`` it, iterate its
``items()``, or concatenate it as a string all render the same call.
"""
from __future__ import annotations

import functools
import json
from typing import Any

from ollapy.engine.backend.bindings import finish_imports


class JSONArguments(dict):
    """Tool-call arguments for a template: a dict whose text (``str``, ``~``, ``+ "..."``) is its JSON."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other: Any) -> Any:
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: Any) -> Any:
        return other + str(self) if isinstance(other, str) else NotImplemented


def _template_call(call: dict) -> dict:
    """One history tool call in OpenAI's shape with :class:`JSONArguments` (``call`` is already checked)."""
    fn = call.get("function") or {}
    out = {"type": "function", "function": {"name": fn.get("name", ""),
                                            "arguments": JSONArguments(fn.get("arguments") or {})}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them: tool calls in OpenAI's shape with :class:`JSONArguments`,
    a tool message's name under both ``name`` and ``tool_name``, and past reasoning (``thinking``)
    also as ``reasoning_content``. Other fields are passed on unchanged."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        if m.get("role") == "tool":
            name = m.get("tool_name") or m.get("name")
            if name:
                m["name"] = m["tool_name"] = name
        if m.get("thinking") and "reasoning_content" not in m:
            m["reasoning_content"] = m["thinking"]
        out.append(m)
    return out


def template_mentions_tools(template: str | None) -> bool:
    """Whether a chat template can render tool definitions (it reads a ``tools`` variable)."""
    return "tools" in (template or "")


def render_chat_template(template: str, messages: list[dict], bos: str, eos: str, add_generation_prompt: bool = True,
                         *, tools: list[dict] | None = None, variables: dict[str, Any] | None = None) -> str:
    """Render ``messages`` with llama-cpp-python's sandboxed Jinja2 chat formatter.

    ``tools`` (OpenAI/Ollama function tools) is passed as the template's ``tools``;
    ``variables`` are extra template variables (``enable_thinking``, ``think``...).
    Messages go through :func:`template_messages`. Raises ValueError when the template
    itself raises (e.g. bad role order).
    """
    formatter = _chat_formatter(template, bos, eos, add_generation_prompt)
    return formatter(messages=template_messages(messages), tools=tools or None, **(variables or {})).prompt


@functools.lru_cache(maxsize=32)
def _chat_formatter(template: str, bos: str, eos: str, add_generation_prompt: bool):
    """A compiled formatter per template: compiling the Jinja2 source took longer than rendering with it (a
    server profile at 16 clients: 90 of 150 prompt-building samples). Rendering is stateless and thread-safe."""
    finish_imports()
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)


# llama-cpp-python's schema converter lets any character but '"' and '\\' into a string; JSON (RFC 8259, section 7)
# and llama.cpp's own converter (common/json-schema-to-grammar.cpp, "char") exclude the control characters
# U+0000-U+001F and DEL, so a raw newline can never end up inside a string.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


_SHAPE_KEYS = frozenset(("type", "$ref", "enum", "const", "oneOf", "anyOf", "allOf", "not", "properties",
                         "additionalProperties", "patternProperties", "items", "prefixItems", "pattern", "format",
                         "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum", "required"))
_ANY_TYPE = ["object", "array", "string", "number", "boolean", "null"]
MAX_GRAMMAR_REPEAT = 512
"""Largest ``minLength``/``maxLength``/``minItems``/``maxItems`` kept in a grammar. llama-cpp-python's converter
spells a bound of N as N nested optional groups, and llama.cpp parses nesting recursively: Claude Code's tools
carry ``maxLength: 524288``, a 4 MB grammar whose parse overflowed the thread's stack (a segfault). Larger bounds
are dropped (the value is then unbounded there; the client still validates it)."""


def loosen_schema(schema: Any) -> Any:
    """``schema`` made fit for llama-cpp-python's JSON-schema converter, for tool schemas agents send:

    * a subschema that constrains nothing (only annotations such as ``description``: JSON Schema's "any value")
      becomes a list of all types (the converter refuses it: "Unrecognized schema");
    * length and item-count bounds over :data:`MAX_GRAMMAR_REPEAT` are dropped.

    Everything else is kept; nested subschemas are walked.
    """
    if isinstance(schema, list):
        return [loosen_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema and not (_SHAPE_KEYS & schema.keys()):
        return {"type": list(_ANY_TYPE)}
    out = {k: v for k, v in schema.items()
           if not (k in ("minLength", "maxLength", "minItems", "maxItems") and isinstance(v, int)
                   and v > MAX_GRAMMAR_REPEAT)}
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: loosen_schema(v) for k, v in out[key].items()}
    for key in ("items", "additionalProperties", "not", "prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), (dict, list)):
            out[key] = loosen_schema(out[key])
    return out


@functools.lru_cache(maxsize=64)
def json_schema_grammar(schema_json: str | None) -> str:
    """GBNF grammar text for JSON output: any JSON object, or one matching ``schema_json`` (a JSON string).

    Strings admit no raw control characters (they must be escaped, as JSON
    requires). Raises whatever the schema converter raises for a schema it
    cannot convert (the caller maps it to an OptionError). The last 64 grammars
    are kept: an agent sends the same tools (so the same generic-format or
    forced-call schema) on every turn, and the conversion runs where the
    request is submitted.
    """
    finish_imports()
    from llama_cpp import llama_grammar

    if schema_json is None:
        return llama_grammar.JSON_GBNF
    gbnf = llama_grammar.json_schema_to_gbnf(json.dumps(loosen_schema(json.loads(schema_json))))
    return "\n".join(_JSON_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in gbnf.split("\n"))

