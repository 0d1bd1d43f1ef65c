#!/usr/bin/env python3
"""Regenerate the generated documentation: the command reference and the OLLAPY_* settings table.

The command reference (docs/cli.md) comes from typer/click's own help of every command
(``ollapy.cli.main.app``); the settings table (docs/settings.md) from ``ollapy.config.SETTINGS``.
Each replaces the text between its page's ``<!-- BEGIN commands -->``/``<!-- END commands -->`` or
``<!-- BEGIN settings -->``/``<!-- END settings -->`` markers.

Usage: python scripts/gen_docs.py [--check]   (--check exits 1 when a page is stale)
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
        ctx = cmd.context_class(cmd, info_name=path, terminal_width=100, max_content_width=100,
                                help_option_names=root.context_settings.get("help_option_names"))  # as main.py sets
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


PAGES = {"commands": ROOT / "docs" / "cli.md", "settings": ROOT / "docs" / "settings.md"}


def render(name: str, text: str) -> str:
    """Return ``text`` with its generated section ``name`` (``commands`` or ``settings``) replaced.

    Raises SystemExit when the page lacks the section's markers."""
    body = commands_markdown() if name == "commands" else settings_markdown()
    pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"{PAGES[name]} lacks the <!-- BEGIN {name} --> / <!-- END {name} --> markers")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is not up to date")
    args = ap.parse_args()
    stale = 0
    for name, path in PAGES.items():
        old = path.read_text()
        new = render(name, old)
        if new == old:
            continue
        if args.check:
            print(f"{path.relative_to(ROOT)} is stale: run python scripts/gen_docs.py", file=sys.stderr)
            stale = 1
        else:
            path.write_text(new)
            print(f"{path.relative_to(ROOT)} updated")
    return stale


if __name__ == "__main__":
    sys.exit(main())
