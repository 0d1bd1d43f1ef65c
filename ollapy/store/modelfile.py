"""Ollama Modelfile parser: FROM, PARAMETER, SYSTEM, TEMPLATE, LICENSE, MESSAGE, ADAPTER, DRAFT.

``ADAPTER <path>`` names a LoRA adapter GGUF (relative paths are the Modelfile's, as for FROM); several may be
given and are applied in order, each at scale 1.0 as Ollama applies them.

``DRAFT <model or path>`` (Ollama's instruction) names a draft model for speculative decoding; it is read
as the option ``draft`` (``PARAMETER draft ngram`` selects draftless n-gram drafting), so a later ``DRAFT``
or ``PARAMETER draft`` replaces an earlier one.

Instructions are case-insensitive; ``#`` starts a comment line. A value is the
rest of the line, or a quoted string that may span lines, read as Ollama's
parser reads it: a value that starts with ``\"\"\"`` ends at the first line end
where the text so far (trailing blanks aside) ends with ``\"\"\"``, and one that
starts with ``"`` at the first line end where it ends with ``"``; the quotes are
removed and nothing inside is unescaped, except that a one-line ``"..."`` value
that is a valid JSON string is JSON-decoded (``show --modelfile`` writes values
that way when the plain forms cannot carry them). ``PARAMETER stop`` may repeat
(values accumulate). Errors are :class:`~ollapy.errors.UsageError` naming the line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ollapy.errors import OptionError, UsageError
from ollapy.options import LIST_OPTIONS, coerce_option
from ollapy.store.info import parameter_text

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Modelfile:
    """A parsed Modelfile. ``parameters`` maps Ollama option names to typed values (``stop`` is a list)."""

    from_: str = ""
    projector: str = ""  # a second FROM: a vision model's projector (mmproj GGUF), as in Ollama
    parameters: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    license: list[str] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)  # ADAPTER lines: LoRA adapter GGUF paths, in order


def _read_value(text: str, pos: int, lineno: int) -> tuple[str, int, int]:
    """Read a value starting at ``pos``; return (value, position after its line, line number after it)."""
    if text.startswith('"', pos):
        close = '"""' if text.startswith('"""', pos) else '"'
        at = pos
        while True:  # Ollama: the value ends at the first line end where it is a closed quoted string
            nl = text.find("\n", at)
            stop = nl if nl >= 0 else len(text)
            chunk = text[pos:stop].rstrip()
            if len(chunk) >= 2 * len(close) and chunk.endswith(close):
                break
            if nl < 0:
                what = '""" string' if len(close) == 3 else "quoted string"
                raise UsageError(f"Modelfile line {lineno}: unterminated {what}", hint=f"close it with {close}")
            at = nl + 1
        value = chunk[len(close):-len(close)]
        if len(close) == 1 and "\n" not in value:
            try:  # a JSON string, as `show --modelfile` writes awkward values: "say \"hi\"", "a\nb", "\u00e9"
                value = json.loads(chunk)
            except ValueError:
                pass
        return value, (nl + 1 if nl >= 0 else len(text)), lineno + text.count("\n", pos, stop) + 1
    nl = text.find("\n", pos)
    line = text[pos: nl if nl >= 0 else len(text)].strip()
    return line, (nl + 1 if nl >= 0 else len(text)), lineno + 1


def _skip_blanks(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos


def _word(text: str, pos: int) -> str:
    """The word at ``pos``: up to the next blank or line end."""
    end = pos
    while end < len(text) and text[end] not in " \t\n":
        end += 1
    return text[pos:end]


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
        vstart = _skip_blanks(text, pos + indent + len(word))
        start_line = lineno
        if cmd == "PARAMETER":
            key = _word(text, vstart)
            raw, pos, lineno = _read_value(text, _skip_blanks(text, vstart + len(key)), lineno)
            try:
                typed = coerce_option(key, raw)
            except OptionError as exc:
                raise UsageError(f"Modelfile line {start_line}: {exc.message}", hint=exc.hint) from None
            if key in LIST_OPTIONS:  # stop, dry_sequence_breakers: one value a line
                mf.parameters.setdefault(key, []).extend(typed)
            else:
                mf.parameters[key] = typed
            continue
        if cmd == "MESSAGE":
            head = _word(text, vstart)
            role = head.lower()
            if role not in ROLES:
                raise UsageError(f"Modelfile line {start_line}: MESSAGE role must be one of {', '.join(ROLES)}")
            value, pos, lineno = _read_value(text, _skip_blanks(text, vstart + len(head)), lineno)
            mf.messages.append({"role": role, "content": value})
            continue
        if cmd not in ("FROM", "SYSTEM", "TEMPLATE", "LICENSE", "DRAFT", "ADAPTER"):
            hint = "use FROM, PARAMETER, SYSTEM, TEMPLATE, LICENSE, MESSAGE, ADAPTER or DRAFT"
            raise UsageError(f"Modelfile line {start_line}: unknown instruction {word[:30]!r}", hint=hint)
        value, pos, lineno = _read_value(text, vstart, lineno)
        if cmd == "FROM" and mf.from_:  # model + projector, as Ollama's vision Modelfiles
            if mf.projector:
                raise UsageError(f"Modelfile line {start_line}: a third FROM", hint="FROM the model, then FROM its "
                                 "projector (mmproj GGUF)")
            mf.projector = value.strip()
        elif cmd == "FROM":
            mf.from_ = value.strip()
        elif cmd == "SYSTEM":
            mf.system = value
        elif cmd == "TEMPLATE":
            mf.template = value
        elif cmd == "ADAPTER":
            if not value.strip():
                raise UsageError(f"Modelfile line {start_line}: ADAPTER needs the path of a LoRA adapter GGUF",
                                 hint="e.g. ADAPTER ./my-lora.gguf")
            mf.adapters.append(value.strip())
        elif cmd == "DRAFT":
            if not value.strip():
                raise UsageError(f"Modelfile line {start_line}: DRAFT needs a model name or a .gguf path",
                                 hint="e.g. DRAFT ./draft.gguf, or PARAMETER draft ngram for n-gram drafting")
            try:
                mf.parameters["draft"] = coerce_option("draft", value)
            except OptionError as exc:
                raise UsageError(f"Modelfile line {start_line}: {exc.message}", hint=exc.hint) from None
        else:
            mf.license.append(value)
    if not mf.from_:
        raise UsageError("Modelfile has no FROM line", hint="add FROM <path-to.gguf or model name>")
    return mf


def quote_value(value: str) -> str:
    """``value`` quoted so that :func:`parse_modelfile` reads it back unchanged.

    ``"value"`` when that is plain; else ``\"\"\"value\"\"\"`` (raw, readable: multi-line
    prompts and templates stay as they are) when it reads back unchanged; else a
    JSON string on one line (for values with a line ending in ``\"\"\"``, a
    carriage return, or control characters).
    """
    plain = json.dumps(value, ensure_ascii=False)
    if plain == f'"{value}"':
        return plain
    if "\r" not in value:
        triple = f'"""{value}"""'
        try:
            back, end, _ = _read_value(triple, 0, 1)
        except UsageError:
            back, end = None, 0
        if back == value and end == len(triple):
            return triple
    return plain


def format_modelfile(from_: str, parameters: dict[str, Any], system: str | None, template: str | None,
                     license: str | None, messages: list[dict[str, str]], adapters: list[str] | None = None) -> str:
    """Render a Modelfile (for ``ollapy show --modelfile``)."""
    out = [f"FROM {from_}"]
    out += [f"ADAPTER {a}" for a in adapters or ()]
    if template:
        out.append(f"TEMPLATE {quote_value(template)}")
    if system:
        out.append(f"SYSTEM {quote_value(system)}")
    for k, v in parameters.items():
        if k == "draft" and v and v != "ngram":
            out.append(f"DRAFT {v}")
            continue
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            out.append(f"PARAMETER {k} {parameter_text(item)}")
    for m in messages:
        out.append(f"MESSAGE {m.get('role')} {quote_value(str(m.get('content', '')))}")
    if license:
        out.append(f"LICENSE {quote_value(license)}")
    return "\n".join(out) + "\n"
