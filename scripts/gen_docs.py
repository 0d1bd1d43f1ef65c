#!/usr/bin/env python3
"""Regenerate the generated documentation from the code: commands, settings, model options, metrics, catalogue.

Each section replaces the text between its page's ``<!-- BEGIN NAME -->`` and ``<!-- END NAME -->`` markers
(:data:`SECTIONS`): the command reference (docs/cli.md) from typer/click's own help of every command
(``ollapy.cli.main.app``); the ``OLLAPY_*`` settings (docs/settings.md) from ``ollapy.settings.SETTINGS`` and
``SCRIPT_SETTINGS``; the model options (docs/options.md) from ``ollapy.options``; the metrics (docs/metrics.md) from
what ``ollapy.server.metrics.Metrics`` exposes (Prometheus' own text, so counters carry their ``_total``); the
catalogue (docs/models.md) from ``models/*.toml``.

Usage: python scripts/gen_docs.py [--check]   (--check exits 1 when a page is stale)
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import MISSING, fields
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


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell (no pipe, no line break)."""
    return " ".join(str(text).replace("|", "/").split())


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


def _settings_table(settings) -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for s in settings.values():
        default = f"`{s.default}`" if s.default else "(see meaning)"
        rows.append(f"| `{s.env}` | {default} | {_cell(s.description)} |")
    return "\n".join(rows)


def settings_markdown() -> str:
    """Markdown table of every OLLAPY_* setting ollapy reads, with its default and description."""
    from ollapy.settings import SETTINGS

    return _settings_table(SETTINGS)


def script_settings_markdown() -> str:
    """Markdown table of the OLLAPY_* variables the repository's scripts read (install, checks)."""
    from ollapy.settings import SCRIPT_SETTINGS

    return _settings_table(SCRIPT_SETTINGS)


def _option_type(name: str, typ: str) -> str:
    from ollapy import options as o

    if name in getattr(o, "LIST_OPTIONS", ("stop",)):  # options whose value is a list of strings
        return "list of strings"
    return {"str": "string"}.get(typ, typ)


def _option_default(f) -> str:
    value = f.default_factory() if f.default is MISSING else f.default
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value}`"


def options_markdown() -> str:
    """Markdown table of every model option (``ollapy.options.Options``): name, type, default, values, when it
    applies (load: reloads the model; request: one generation) and what it does (``OPTION_HELP``).

    Raises KeyError naming an option without a description."""
    from ollapy import options as o

    rows = ["| option | type | default | values | applies | what it does |", "|---|---|---|---|---|---|"]
    for f in fields(o.Options):
        if f.name in o.LOAD_OPTIONS or (f.name == "draft"):
            applies = "load" + (" (a draft model; ngram: request)" if f.name == "draft" else "")
        else:
            applies = "request"
        if f.name in o.SERVER_ONLY_OPTIONS:
            applies += "; not in an HTTP request"
        rows.append(f"| `{f.name}` | {_cell(_option_type(f.name, f.type))} | {_cell(_option_default(f))} | "
                    f"{_cell(o.option_values(f.name))} | {applies} | {_cell(o.option_help(f.name))} |")
    compat = ", ".join(f"`{n}`" for n in sorted(o.COMPAT_OPTIONS))
    return "\n".join(rows) + ("\n\nAccepted in an HTTP request's `options` and ignored (Ollama's client still "
                              f"sends them; a wrong type is still a 400): {compat}.")


def _standin_metrics():
    """A :class:`~ollapy.server.metrics.Metrics` with one stand-in loaded model and one finished drafted request,
    so that every family exposes its samples (and so its labels)."""
    from types import SimpleNamespace

    from ollapy.cache.stats import CacheStats
    from ollapy.engine.interface import RunnerSnapshot
    from ollapy.server.metrics import Metrics

    snap = RunnerSnapshot(stats={"slots": 1}, cache=CacheStats())
    model = SimpleNamespace(key="MODEL", model=SimpleNamespace(snapshot=lambda: snap))
    m = Metrics(SimpleNamespace(models={"MODEL": model}))
    m.observe_done("MODEL", {"prompt_eval_count": 2, "eval_count": 2, "eval_duration": 10**6, "draft": "ngram"}, 0.1)
    return m


def metrics_markdown() -> str:
    """Markdown table of every metric family ``GET /metrics`` exposes, as Prometheus' text names its series (a
    counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``), with labels and help."""
    from prometheus_client.parser import text_string_to_metric_families

    m = _standin_metrics()
    wrappers = {w.describe()[0].name: w for w in vars(m).values() if hasattr(w, "_labelnames")}
    rows = ["| series | type | labels | meaning |", "|---|---|---|---|"]
    for fam in text_string_to_metric_families(m.render().decode()):
        if fam.name.endswith("_created") or fam.type == "unknown":
            continue  # prometheus_client's creation-time gauges of counters and histograms
        series = {"counter": [f"{fam.name}_total"],
                  "histogram": [f"{fam.name}_bucket", f"{fam.name}_sum", f"{fam.name}_count"]}.get(fam.type,
                                                                                                    [fam.name])
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        if not labels and fam.name in wrappers:
            labels = list(wrappers[fam.name]._labelnames)  # noqa: SLF001 - a labelled metric with no sample yet
        rows.append(f"| {', '.join(f'`{s}`' for s in series)} | {fam.type} | "
                    f"{', '.join(f'`{x}`' for x in labels)} | {_cell(fam.documentation)} |")
    return "\n".join(rows)


def _source_text(src: dict) -> str:
    if src["kind"] == "hf":
        what = src.get("file") or src.get("quant", "")
        return f"`hf.co/{src['repo']}` ({what})"
    parts = src["parts"]
    first = parts[0][0]
    pkg, version = first.split("==")
    if len(parts) == 1:
        return f"PyPI `{first}`"
    return f"PyPI `{pkg[:-1]}1..{len(parts)}=={version}` ({len(parts)} wheels)"


def catalogue_markdown() -> str:
    """Markdown table of the catalogue (``models/*.toml``): every ``family:tag`` with its size, kind, size on disk
    (when pinned), sources in the order they are tried, and default parameters."""
    from ollapy.store.catalogue import load_families

    rows = ["| name | parameters | kind | file size | sources, in order | default parameters |",
            "|---|---|---|---|---|---|"]
    for fam in load_families(ROOT / "models"):
        for t in fam.tags:
            name = f"`{t.alias}`" + (f" = `{fam.family}`" if t.tag == fam.default else "")
            size = f"{t.size / 1e6:,.0f} MB" if t.size else ""
            params = ", ".join(f"`{k} {v}`" for k, v in t.params.items() if k != "stop")
            rows.append(f"| {name} | {t.parameters or ''} | {t.kind or ''} | {size} | "
                        f"{'; '.join(_source_text(s) for s in t.sources)} | {params} |")
    return "\n".join(rows)


#: section name -> (page, renderer)
SECTIONS = {
    "commands": (ROOT / "docs" / "cli.md", commands_markdown),
    "settings": (ROOT / "docs" / "settings.md", settings_markdown),
    "script-settings": (ROOT / "docs" / "settings.md", script_settings_markdown),
    "options": (ROOT / "docs" / "options.md", options_markdown),
    "metrics": (ROOT / "docs" / "metrics.md", metrics_markdown),
    "catalogue": (ROOT / "docs" / "models.md", catalogue_markdown),
}
#: kept for callers of the first version (section name -> page)
PAGES = {name: page for name, (page, _) in SECTIONS.items()}


def render(name: str, text: str) -> str:
    """Return ``text`` with its generated section ``name`` (a key of :data:`SECTIONS`) replaced.

    Raises SystemExit when the page lacks the section's markers."""
    page, renderer = SECTIONS[name]
    body = renderer()
    pat = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"{page} lacks the <!-- BEGIN {name} --> / <!-- END {name} --> markers")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is not up to date")
    args = ap.parse_args()
    stale = 0
    for page in dict.fromkeys(page for page, _ in SECTIONS.values()):
        old = page.read_text()
        new = old
        for name in (n for n, (p, _) in SECTIONS.items() if p == page):
            new = render(name, new)
        if new == old:
            continue
        if args.check:
            print(f"{page.relative_to(ROOT)} is stale: run python scripts/gen_docs.py", file=sys.stderr)
            stale = 1
        else:
            page.write_text(new)
            print(f"{page.relative_to(ROOT)} updated")
    return stale


if __name__ == "__main__":
    sys.exit(main())
