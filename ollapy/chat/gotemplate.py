"""Ollama's Go-template TEMPLATEs, translated to the Jinja2 chat templates ollapy renders.

Ollama's Modelfile ``TEMPLATE`` is a Go ``text/template`` (https://pkg.go.dev/text/template),
executed the way Ollama's ``template`` package executes it (``Template.Execute`` and
``collate`` in github.com/ollama/ollama, template/template.go). ollapy renders Jinja2
(``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``), so ``create``
translates the subset of Go templates that Ollama's library templates use:

* fields ``.System``, ``.Prompt``, ``.Response``, ``.Messages``, ``.Suffix`` (the ``suffix`` variable,
  set for a fill-in-the-middle request, as Ollama sets it with ``.Prompt``) and, on a message,
  ``.Role`` and ``.Content``; ``$`` (the top level), ``$x := pipeline`` variables;
* actions ``if``/``else if``/``else``/``end``, ``range`` (with ``$i, $m :=`` and ``else``),
  ``with``, comments ``{{/* */}}``, ``{{-``/``-}}`` trimming (all blanks and newlines);
* functions ``eq`` (several operands), ``ne``, ``lt``, ``le``, ``gt``, ``ge``, ``and``,
  ``or``, ``not``, ``len``, ``slice``, ``index``, and pipelines ``a | f``.

Two modes, as in Ollama. A template that names ``.Messages`` gets ``.System`` (every
system message, joined by a blank line) and ``.Messages`` (consecutive messages of the
same role merged with a blank line, tool messages excepted). Any other template is
"legacy": it is executed once per turn with ``.System``, ``.Prompt`` and ``.Response``
(a system message starts a turn, a user message after an answer starts the next one,
so ``.System`` reaches only the turn after it), and the last turn is cut right after
its ``{{ .Response }}`` so the answer continues there. A legacy template that never
names ``.Response`` gets one appended. Ollama templates open the assistant's turn
themselves, so the translation renders the same text whatever ``add_generation_prompt``
says. Anything else raises :class:`~ollapy.errors.UsageError` naming the construct.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ollapy.errors import UsageError

KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"}
FUNCS = {"and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "len", "slice", "index"}
GO_WORDS = KEYWORDS | FUNCS | {"print", "printf", "println", "json", "html", "js", "urlquery", "call", "nil"}
_ACTION_START = re.compile(r"\{\{-?\s*([./$]|[A-Za-z_]\w*)")
_TOKEN = re.compile(r'\s+|(?P<str>"(?:[^"\\\n]|\\.)*"|`[^`]*`)|(?P<num>-?\d+(?![\w.]))|(?P<op>:=|=|\||\(|\)|,)'
                    r"|(?P<var>\$\w*(?:\.[A-Za-z_]\w*)*)|(?P<field>(?:\.[A-Za-z_]\w*)+|\.)|(?P<ident>[A-Za-z_]\w*)")
_GO_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def is_go_template(text: str) -> bool:
    """Whether a TEMPLATE is Go (Ollama's) rather than Jinja2.

    Jinja when it has ``{%`` or ``{#``, or when it has ``{{`` tags and none opens with
    Go syntax (``.Name``, ``$``, a comment, a Go keyword or function: ``{{ messages``,
    ``{{ bos_token }}``). Go otherwise, including text with no tags at all (Ollama
    prints it as it is).
    """
    if "{%" in text or "{#" in text:
        return False
    heads = [m.group(1) for m in _ACTION_START.finditer(text)]
    return not heads or any(h in ".$/" or h in GO_WORDS for h in heads)


def _refuse(src: str) -> UsageError:
    src = src if len(src) <= 60 else src[:57] + "..."
    return UsageError(f"TEMPLATE uses Go-template construct {src!r} that ollapy cannot translate; "
                      "write the template in Jinja")


# ---- lexer and parser -------------------------------------------------------------------------
@dataclass
class _Action:
    src: str  # as written, for error messages
    words: list[tuple[str, str]]  # (kind, text): str, num, op, var, field, ident


@dataclass
class _Node:
    kind: str  # text, print, set, if, range, with
    text: str = ""
    src: str = ""
    pipe: list = field(default_factory=list)  # print/set: commands; if: [(cond, body), ...]
    names: list[str] = field(default_factory=list)  # set/range: declared variables
    body: list = field(default_factory=list)
    orelse: list = field(default_factory=list)


def _lex(text: str) -> list[str | _Action]:
    """Split into text pieces and actions, applying ``{{-`` / ``-}}`` trimming and dropping comments."""
    out: list[str | _Action] = []
    pos = 0
    while True:
        at = text.find("{{", pos)
        if at < 0:
            out.append(text[pos:])
            return [p for p in out if p != ""]
        lead = text[pos:at]
        i = at + 2
        if text.startswith("-", i) and i + 1 < len(text) and text[i + 1] in " \t\r\n":
            lead, i = lead.rstrip(" \t\r\n"), i + 1
        out.append(lead)
        words, trim_after = [], False
        while True:
            m = _TOKEN.match(text, i)
            if text.startswith("}}", i):
                end = i + 2
                break
            if text.startswith("-}}", i) and text[i - 1] in " \t\r\n":
                end, trim_after = i + 3, True
                break
            if text.startswith("/*", i):
                close = text.find("*/", i)
                if close < 0 or words:
                    raise _refuse(text[at:at + 40])
                i = close + 2
                continue
            if m is None or m.end() == i:
                raise _refuse(text[at:text.find("}}", at) + 2 if "}}" in text[at:] else at + 40])
            if m.lastgroup:
                words.append((m.lastgroup, m.group(m.lastgroup)))
            i = m.end()
        src = text[at:end]
        if words:
            out.append(_Action(src, words))
        pos = end
        if trim_after:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1


class _Parser:
    def __init__(self, items: list[str | _Action]) -> None:
        self.items, self.i = items, 0

    def parse_list(self, stops: tuple[str, ...]) -> tuple[list[_Node], _Action | None]:
        """Nodes up to an action whose first word is in ``stops`` (returned too; None at the end)."""
        nodes: list[_Node] = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, str):
                nodes.append(_Node("text", text=item))
                continue
            head = item.words[0][1] if item.words[0][0] == "ident" else ""
            if head in stops:
                return nodes, item
            if head == "if":
                nodes.append(self.parse_if(item))
            elif head in ("range", "with"):
                nodes.append(self.parse_block(item, head))
            elif head in KEYWORDS:
                raise _refuse(item.src)
            else:
                nodes.append(self.parse_action(item))
        if stops:
            raise UsageError(f"TEMPLATE has an unclosed Go-template block (no {{{{ {stops[-1]} }}}})",
                             hint="close every if/range/with with {{ end }}")
        return nodes, None

    def parse_if(self, item: _Action) -> _Node:
        node = _Node("if", src=item.src)
        cond = item.words[1:]
        while True:
            body, stop = self.parse_list(("else", "end"))
            node.pipe.append((self.pipeline(cond, item.src), body))
            assert stop is not None
            if stop.words[0][1] == "end":
                return node
            if len(stop.words) > 1 and stop.words[1] == ("ident", "if"):
                cond, item = stop.words[2:], stop
                continue
            if len(stop.words) > 1:
                raise _refuse(stop.src)
            node.orelse, stop = self.parse_list(("end",))
            return node

    def parse_block(self, item: _Action, head: str) -> _Node:
        words = item.words[1:]
        names: list[str] = []
        if ("op", ":=") in words:
            cut = words.index(("op", ":="))
            names = [t for k, t in words[:cut] if k == "var"]
            if head != "range" or not 1 <= len(names) <= 2 or cut != 2 * len(names) - 1:
                raise _refuse(item.src)
            words = words[cut + 1:]
        node = _Node(head, src=item.src, names=names, pipe=self.pipeline(words, item.src))
        node.body, stop = self.parse_list(("else", "end"))
        assert stop is not None
        if stop.words[0][1] == "else":
            if len(stop.words) > 1:
                raise _refuse(stop.src)
            node.orelse, _ = self.parse_list(("end",))
        return node

    def parse_action(self, item: _Action) -> _Node:
        words = item.words
        if len(words) > 2 and words[0][0] == "var" and words[1] == ("op", ":="):
            return _Node("set", src=item.src, names=[words[0][1]], pipe=self.pipeline(words[2:], item.src))
        return _Node("print", src=item.src, pipe=self.pipeline(words, item.src))

    def pipeline(self, words: list[tuple[str, str]], src: str) -> list:
        """A pipeline: a list of commands, each a list of arguments ((kind, text) or a nested pipeline)."""
        cmds: list[list] = [[]]
        stack = [cmds]
        for w in words:
            if w == ("op", "("):
                inner: list[list] = [[]]
                stack[-1][-1].append(inner)
                stack.append(inner)
            elif w == ("op", ")"):
                if len(stack) == 1 or not all(stack[-1]):
                    raise _refuse(src)
                stack.pop()
            elif w == ("op", "|"):
                stack[-1].append([])
            elif w[0] == "op":  # := or = or , outside the forms above
                raise _refuse(src)
            else:
                stack[-1][-1].append(w)
        if len(stack) != 1 or any(not c for c in cmds):
            raise _refuse(src)
        return cmds


# ---- Jinja emitter ----------------------------------------------------------------------------
def _jstr(s: str) -> str:
    """A Jinja2 string literal for ``s``."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r") + "'"


def _go_string(lit: str) -> str:
    if lit.startswith("`"):
        return lit[1:-1]
    return re.sub(r"\\(.)", lambda m: _GO_ESCAPES.get(m.group(1), m.group(0)), lit[1:-1])


class _Emitter:
    """Turns parsed nodes into Jinja2 source. Values carry a kind: root, msgs, msg, bool or value."""

    def __init__(self, root: dict[str, tuple[str, str]]) -> None:
        self.root = root
        self.out: list[str] = []
        self.n = 0

    def nodes(self, nodes: list[_Node], dot: tuple[str, str], scope: dict) -> None:
        for node in nodes:
            if node.kind == "text":
                self.out.append("{{- " + _jstr(node.text) + " -}}")
            elif node.kind == "print":
                expr, kind = self.pipe(node.pipe, dot, scope, node.src)
                if kind in ("root", "msgs", "msg"):
                    raise _refuse(node.src)
                self.out.append("{{- " + (f"('true' if {expr} else 'false')" if kind == "bool" else expr) + " -}}")
            elif node.kind == "set":
                expr, kind = self.pipe(node.pipe, dot, scope, node.src)
                name = "v_" + node.names[0][1:]
                scope[node.names[0]] = (name, kind)
                self.out.append(f"{{%- set {name} = {expr} -%}}")
            elif node.kind == "if":
                for k, (cond, body) in enumerate(node.pipe):
                    expr, _ = self.pipe(cond, dot, scope, node.src)
                    self.out.append(f"{{%- {'elif' if k else 'if'} {expr} -%}}")
                    self.nodes(body, dot, dict(scope))
                self.else_end(node, dot, scope, "endif")
            elif node.kind == "range":
                expr, kind = self.pipe(node.pipe, dot, scope, node.src)
                if kind != "msgs":
                    raise _refuse(node.src)
                self.n += 1
                item, inner = f"m{self.n}", dict(scope)
                self.out.append(f"{{%- for {item} in {expr} -%}}{{%- set i{self.n} = loop.index0 -%}}")
                if len(node.names) == 2:
                    inner[node.names[0]] = (f"i{self.n}", "value")
                if node.names:
                    inner[node.names[-1]] = (item, "msg")
                self.nodes(node.body, (item, "msg"), inner)
                self.else_end(node, dot, scope, "endfor")
            else:  # with
                expr, kind = self.pipe(node.pipe, dot, scope, node.src)
                self.n += 1
                name = f"w{self.n}"
                self.out.append(f"{{%- set {name} = {expr} -%}}{{%- if {name} -%}}")
                self.nodes(node.body, (name, kind), dict(scope))
                self.else_end(node, dot, scope, "endif")

    def else_end(self, node: _Node, dot, scope, end: str) -> None:
        if node.orelse:
            self.out.append("{%- else -%}")
            self.nodes(node.orelse, dot, dict(scope))
        self.out.append(f"{{%- {end} -%}}")

    def pipe(self, cmds: list, dot, scope, src: str) -> tuple[str, str]:
        value = None
        for cmd in cmds:
            value = self.command(cmd + ([("=", *value)] if value is not None else []), dot, scope, src)
        assert value is not None
        return value

    def command(self, args: list, dot, scope, src: str) -> tuple[str, str]:
        head = args[0]
        if isinstance(head, tuple) and head[0] == "ident" and head[1] not in ("true", "false"):
            name = head[1]
            if name not in FUNCS:
                raise _refuse(src)
            vals = [self.arg(a, dot, scope, src) for a in args[1:]]
            return self.call(name, vals, src)
        if len(args) != 1:
            raise _refuse(src)
        return self.arg(head, dot, scope, src)

    def call(self, name: str, vals: list[tuple[str, str]], src: str) -> tuple[str, str]:
        exprs = [v[0] for v in vals]
        n = len(vals)
        if name in ("and", "or") and n >= 1:
            return "(" + f" {name} ".join(exprs) + ")", "value"
        ops = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        if name == "eq" and n >= 2:
            return "(" + " or ".join(f"{exprs[0]} == {e}" for e in exprs[1:]) + ")", "bool"
        if name in ops and n == 2:
            return f"({exprs[0]} {ops[name]} {exprs[1]})", "bool"
        if name == "not" and n == 1:
            return f"(not {exprs[0]})", "bool"
        if name == "len" and n == 1:
            return f"({exprs[0]} | length)", "value"
        if name == "slice" and 1 <= n <= 3:
            return f"{exprs[0]}[{':'.join(exprs[1:]) if n == 3 else (exprs[1] + ':' if n == 2 else ':')}]", vals[0][1]
        if name == "index" and n == 2:
            return f"{exprs[0]}[{exprs[1]}]", "msg" if vals[0][1] == "msgs" else "value"
        raise _refuse(src)

    def arg(self, a, dot, scope, src: str) -> tuple[str, str]:
        if isinstance(a, list):  # a parenthesized pipeline
            return self.pipe(a, dot, scope, src)
        if a[0] == "=":  # the previous command's value, last argument of the next one in a pipeline
            return a[1], a[2]
        kind, text = a
        if kind == "str":
            return _jstr(_go_string(text)), "value"
        if kind == "num":
            return text, "value"
        if kind == "ident" and text in ("true", "false"):
            return text, "bool"
        if kind == "field":
            return self.fields(dot, text.split(".")[1:] if text != "." else [], src)
        if kind == "var":
            name, *chain = text.split(".")
            if name == "$":
                base = ("", "root")
            elif name in scope:
                base = scope[name]
            else:
                raise _refuse(src)
            return self.fields(base, chain, src)
        raise _refuse(src)

    def fields(self, base: tuple[str, str], chain: list[str], src: str) -> tuple[str, str]:
        for name in chain:
            if base[1] == "root" and name in self.root:
                base = self.root[name]
            elif base[1] == "msg" and name in ("Role", "Content"):
                base = (f"{base[0]}['{name.lower()}']", "value")
            else:
                raise _refuse(src)
        if base[1] == "root":
            raise _refuse(src)
        return base


# ---- whole templates --------------------------------------------------------------------------
_COLLATE = (
    "{%- set ns = namespace(msgs=[], sys=[]) -%}\n"
    "{%- for m in messages -%}\n"
    "{%- set c = m['content'] or '' -%}\n"
    "{%- if m['role'] == 'system' -%}{%- set ns.sys = ns.sys + [c] -%}{%- endif -%}\n"
    "{%- if ns.msgs and ns.msgs[-1]['role'] == m['role'] and m['role'] != 'tool' -%}\n"
    "{%- set ns.msgs = ns.msgs[:-1] + [{'role': m['role'], 'content': ns.msgs[-1]['content'] + '\\n\\n' + c}] -%}\n"
    "{%- else -%}{%- set ns.msgs = ns.msgs + [{'role': m['role'], 'content': c}] -%}{%- endif -%}\n"
    "{%- endfor -%}\n"
)
_LEGACY_LOOP = (
    "{%- set t = namespace(system='', prompt='', response='') -%}\n"
    "{%- for m in ns.msgs -%}\n"
    "{%- if (m['role'] == 'system' and (t.prompt or t.response)) or (m['role'] == 'user' and t.response) -%}\n"
    "{{- go_turn(t.system, t.prompt, t.response) -}}\n"
    "{%- set t.system = '' -%}{%- set t.prompt = '' -%}{%- set t.response = '' -%}\n"
    "{%- endif -%}\n"
    "{%- if m['role'] == 'system' -%}{%- set t.system = m['content'] -%}\n"
    "{%- elif m['role'] == 'user' -%}{%- set t.prompt = m['content'] -%}\n"
    "{%- elif m['role'] == 'assistant' -%}{%- set t.response = m['content'] -%}{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{{- go_last_turn(t.system, t.prompt, t.response) -}}\n"
)


def _identifiers(nodes: list[_Node]) -> set[str]:
    """Lower-cased field and variable names used anywhere (Ollama's ``Template.Vars``)."""
    names: set[str] = set()

    def pipe(p) -> None:
        for item in p if isinstance(p, list) else [p]:
            if isinstance(item, list):
                pipe(item)
            elif item[0] in ("field", "var"):
                names.update(x.lower() for x in item[1].split(".") if x)

    for n in nodes:
        if n.kind == "if":
            for cond, body in n.pipe:
                pipe(cond)
                names |= _identifiers(body)
        else:
            pipe(n.pipe)
        names |= _identifiers(n.body) | _identifiers(n.orelse)
    return names


def _cut_after_response(nodes: list[_Node], state: list[bool]) -> list[_Node]:
    """Ollama's last legacy turn: every node after the first ``.Response`` field (depth first) is dropped."""
    out: list[_Node] = []
    for n in nodes:
        if state[0]:
            break
        if n.kind in ("print", "set") and any(
                isinstance(a, tuple) and a[0] == "field" and "Response" in a[1].split(".") for c in n.pipe for a in c):
            state[0] = True
            out.append(n)
            continue
        if n.kind in ("if", "range", "with"):
            n = _Node(n.kind, n.text, n.src, list(n.pipe), n.names, list(n.body), list(n.orelse))
            if n.kind == "if":
                branches = []
                for cond, body in n.pipe:
                    branches.append((cond, _cut_after_response(body, state) if not state[0] else []))
                n.pipe = branches
            else:
                n.body = _cut_after_response(n.body, state)
            n.orelse = _cut_after_response(n.orelse, state) if not state[0] else []
        out.append(n)
    return out


_SUFFIX = "(suffix if suffix is defined else '')"
"""``.Suffix``: the ``suffix`` variable, set only when ``/api/generate`` sends a ``suffix`` (fill-in-the-middle)."""
_FIM_PROMPT = "(prompt if prompt is defined else '')"
"""``.Prompt`` of a template that names ``.Messages``: Ollama sets it only with a ``suffix`` (its ``.Messages``
are then empty), which ollapy passes as the ``prompt`` variable."""


def translate_go_template(text: str) -> str:
    """Jinja2 chat-template source that renders ``messages`` as Ollama renders the Go template ``text``.

    Raises UsageError (one line naming the construct) for Go syntax outside the subset in
    this module's docstring, and for unclosed blocks.
    """
    nodes, _ = _Parser(_lex(text)).parse_list(())
    names = _identifiers(nodes)
    if "messages" in names:
        em = _Emitter({"System": ("g_system", "value"), "Messages": ("g_msgs", "msgs"),
                       "Prompt": (_FIM_PROMPT, "value"), "Response": ("''", "value"), "Suffix": (_SUFFIX, "value")})
        em.nodes(nodes, ("", "root"), {})
        return (_COLLATE + "{%- set g_msgs = ns.msgs -%}{%- set g_system = ns.sys | join('\\n\\n') -%}\n"
                + "\n".join(em.out) + "\n")
    if "response" not in names:
        nodes = nodes + [_Node("print", src="{{ .Response }}", pipe=[[("field", ".Response")]])]
    root = {"System": ("g_system", "value"), "Prompt": ("g_prompt", "value"), "Response": ("g_response", "value"),
            "Suffix": (_SUFFIX, "value")}
    parts = []
    for macro, body in (("go_turn", nodes), ("go_last_turn", _cut_after_response(nodes, [False]))):
        em = _Emitter(root)
        em.nodes(body, ("", "root"), {})
        parts.append(f"{{%- macro {macro}(g_system, g_prompt, g_response) -%}}\n" + "\n".join(em.out)
                     + "\n{%- endmacro -%}\n")
    return "".join(parts) + _COLLATE + _LEGACY_LOOP


def jinja_template(text: str) -> str:
    """The TEMPLATE as ollapy stores it: Jinja2 as is, a Go template translated (UsageError if it cannot be)."""
    return translate_go_template(text) if is_go_template(text) else text
