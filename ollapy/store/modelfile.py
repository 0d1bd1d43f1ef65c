"""Ollama Modelfile parser: FROM, PARAMETER, SYSTEM, TEMPLATE, LICENSE, MESSAGE (and ADAPTER, refused).

Instructions are case-insensitive; ``#`` starts a comment line; a value is the
rest of the line, a ``"double-quoted"`` string, or a ``\"\"\"triple-quoted\"\"\"``
string that may span lines. ``PARAMETER stop`` may repeat (values accumulate).
Errors are :class:`~ollapy.errors.UsageError` naming the line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, UsageError
from ..options import coerce_option
from .info import parameter_text

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Modelfile:
    """A parsed Modelfile. ``parameters`` maps Ollama option names to typed values (``stop`` is a list)."""

    from_: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    license: list[str] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)


def _read_value(text: str, pos: int, lineno: int) -> tuple[str, int, int]:
    """Read a value starting at ``pos``; return (value, new position, new line number)."""
    if text.startswith('"""', pos):
        end = text.find('"""', pos + 3)
        if end < 0:
            raise UsageError(f"Modelfile line {lineno}: unterminated \"\"\" string", hint='close it with """')
        value = text[pos + 3:end]
        nl = text.find("\n", end + 3)
        rest = text[end + 3: nl if nl >= 0 else len(text)].strip()
        if rest:
            raise UsageError(f"Modelfile line {lineno + value.count(chr(10))}: unexpected text after \"\"\": {rest[:30]!r}")
        return value, (nl + 1 if nl >= 0 else len(text)), lineno + value.count("\n") + 1
    nl = text.find("\n", pos)
    line = text[pos: nl if nl >= 0 else len(text)].strip()
    if len(line) >= 2 and line[0] == '"' and line[-1] == '"':
        try:
            line = json.loads(line)
        except ValueError:
            line = line[1:-1]
    return line, (nl + 1 if nl >= 0 else len(text)), lineno + 1


def parse_modelfile(text: str) -> Modelfile:
    """Parse Modelfile text; raises UsageError (unknown instruction, bad parameter, missing FROM)."""
    mf = Modelfile()
    pos, lineno = 0, 1
    text = text.replace("\r\n", "\n")
    while pos < len(text):
        nl = text.find("\n", pos)
        line = text[pos: nl if nl >= 0 else len(text)]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            pos, lineno = (nl + 1 if nl >= 0 else len(text)), lineno + 1
            continue
        indent = len(line) - len(line.lstrip())
        word = stripped.split(None, 1)[0]
        cmd = word.upper()
        vstart = pos + indent + len(word)
        while vstart < len(text) and text[vstart] in " \t":
            vstart += 1
        start_line = lineno
        if cmd == "PARAMETER":
            value, pos, lineno = _read_value(text, vstart, lineno)
            key, _, raw = value.partition(" ")
            raw = raw.strip()
            if len(raw) >= 2 and raw[0] == raw[-1] == '"':
                try:  # a JSON string, as `show --modelfile` writes it: "say \"hi\"", "\u00e9"
                    raw = json.loads(raw)
                except ValueError:
                    raw = raw[1:-1]
            try:
                typed = coerce_option(key.strip(), raw)
            except OptionError as exc:
                raise UsageError(f"Modelfile line {start_line}: {exc.message}", hint=exc.hint) from None
            if key == "stop":
                mf.parameters.setdefault("stop", []).extend(typed)
            else:
                mf.parameters[key] = typed
            continue
        if cmd == "MESSAGE":
            nl2 = text.find("\n", vstart)
            head = text[vstart: nl2 if nl2 >= 0 else len(text)].split(None, 1)
            role = head[0].lower() if head else ""
            if role not in ROLES:
                raise UsageError(f"Modelfile line {start_line}: MESSAGE role must be one of {', '.join(ROLES)}")
            cstart = vstart + len(head[0])
            while cstart < len(text) and text[cstart] in " \t":
                cstart += 1
            value, pos, lineno = _read_value(text, cstart, lineno)
            mf.messages.append({"role": role, "content": value})
            continue
        if cmd not in ("FROM", "SYSTEM", "TEMPLATE", "LICENSE"):
            hint = "ADAPTER is not supported" if cmd == "ADAPTER" else "use FROM, PARAMETER, SYSTEM, TEMPLATE, LICENSE or MESSAGE"
            raise UsageError(f"Modelfile line {start_line}: unknown instruction {word[:30]!r}", hint=hint)
        value, pos, lineno = _read_value(text, vstart, lineno)
        if cmd == "FROM":
            mf.from_ = value.strip()
        elif cmd == "SYSTEM":
            mf.system = value
        elif cmd == "TEMPLATE":
            mf.template = value
        else:
            mf.license.append(value)
    if not mf.from_:
        raise UsageError("Modelfile has no FROM line", hint="add FROM <path-to.gguf or model name>")
    return mf


def _quote(value: str) -> str:
    return f'"""{value}"""' if ("\n" in value or '"' in value) else f'"{value}"'


def format_modelfile(from_: str, parameters: dict[str, Any], system: str | None, template: str | None,
                     license: str | None, messages: list[dict[str, str]]) -> str:
    """Render a Modelfile (for ``ollapy show --modelfile``)."""
    out = [f"FROM {from_}"]
    if template:
        out.append(f"TEMPLATE {_quote(template)}")
    if system:
        out.append(f"SYSTEM {_quote(system)}")
    for k, v in parameters.items():
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            out.append(f"PARAMETER {k} {parameter_text(item)}")
    for m in messages:
        out.append(f"MESSAGE {m.get('role')} {_quote(str(m.get('content', '')))}")
    if license:
        out.append(f"LICENSE {_quote(license)}")
    return "\n".join(out) + "\n"
