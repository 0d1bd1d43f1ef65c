"""Chat-template rendering (llama-cpp-python's sandboxed Jinja2 formatter) and JSON grammars (GBNF)."""
from __future__ import annotations

import functools

from .bindings import finish_imports


def render_chat_template(template: str, messages: list[dict], bos: str, eos: str, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with llama-cpp-python's sandboxed Jinja2 chat formatter.

    Raises ValueError when the template itself raises (e.g. bad role order).
    """
    return _chat_formatter(template, bos, eos, add_generation_prompt)(messages=messages).prompt


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


def json_schema_grammar(schema_json: str | None) -> str:
    """GBNF grammar text for JSON output: any JSON object, or one matching ``schema_json`` (a JSON string).

    Strings admit no raw control characters (they must be escaped, as JSON
    requires). Raises whatever the schema converter raises for a schema it
    cannot convert (the caller maps it to an OptionError).
    """
    finish_imports()
    from llama_cpp import llama_grammar

    if schema_json is None:
        return llama_grammar.JSON_GBNF
    gbnf = llama_grammar.json_schema_to_gbnf(schema_json)
    return "\n".join(_JSON_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in gbnf.split("\n"))

