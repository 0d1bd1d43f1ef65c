#!/usr/bin/env python3
"""Regenerate the README's command reference and OLLAPY_* settings table from the code.

The command reference comes from typer/click's own help of every command
(``ollapy.cli.main.app``); the settings table from ``ollapy.config.SETTINGS``.
They replace the text between the ``<!-- BEGIN commands -->``/``<!-- END commands -->``
and ``<!-- BEGIN settings -->``/``<!-- END settings -->`` markers.

Usage: python scripts/gen_docs.py [--check]   (--check exits 1 when README.md is stale)
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _walk(cmd, prefix: str):
    yield prefix, cmd
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd, info_name=prefix)
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, f"{prefix} {name}")


def commands_markdown() -> str:
    """Markdown of every command's ``--help`` text, in a stable width."""
    import typer

    from ollapy.cli.main import app

    os.environ["COLUMNS"] = "100"
    root = typer.main.get_command(app)
    parts = []
    for path, cmd in _walk(root, "ollapy"):
        ctx = cmd.context_class(cmd, info_name=path, terminal_width=100, max_content_width=100)
        text = cmd.get_help(ctx)
        text = re.sub(r"[ \t]+\n", "\n", text).strip()
        parts.append(f"#### `{path}`\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


def settings_markdown() -> str:
    """Markdown table of every OLLAPY_* setting with its default and description."""
    from ollapy.config import SETTINGS

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in SETTINGS.values():
        default = f"`{s.default}`" if s.default else "(see meaning)"
        rows.append(f"| `{s.env}` | {default} | {s.description.replace('|', '/')} |")
    return "\n".join(rows)


def render(readme: str) -> str:
    """Return README text with both generated sections replaced."""
    for name, body in (("commands", commands_markdown()), ("settings", settings_markdown())):
        pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pat.search(readme):
            raise SystemExit(f"README.md lacks the <!-- BEGIN {name} --> / <!-- END {name} --> markers")
        readme = pat.sub(lambda m, body=body: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), readme)
    return readme


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md is not up to date")
    args = ap.parse_args()
    path = ROOT / "README.md"
    old = path.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print("README.md is stale: run python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        path.write_text(new)
        print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
