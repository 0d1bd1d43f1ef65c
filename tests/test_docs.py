"""The documentation: generated pages match the code, every relative link resolves, the README stays short."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page: lower case, punctuation dropped, spaces as dashes."""
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` (``path``, ``path#anchor``, ``#anchor``) whose file or heading does not exist."""
    bad = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.relative_to(ROOT)}: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_generated_pages_match_the_code():
    p = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr + " — run: python scripts/gen_docs.py"


def test_every_relative_link_resolves():
    bad = [b for page in _pages() for b in broken_links(page)]
    assert bad == []


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "p.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [no anchor](there.md#nope) [web](https://x.org)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_links(page) == ["p.md: missing.md", "p.md: there.md#nope (no such heading)"]
    finally:
        ROOT = saved


def test_readme_is_short_and_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert len(readme.splitlines()) < 250
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in ci
    assert "bash scripts/quickstart.sh" in readme


def test_architecture_map_matches_the_package():
    """docs/design/architecture.md's package map names every package and shared module of ``ls ollapy/``."""
    text = (DOCS / "design" / "architecture.md").read_text()
    block = text.split("```", 2)[1]
    for child in sorted((ROOT / "ollapy").iterdir()):
        if child.name.startswith("_") or child.name == "__pycache__":
            continue
        name = f"{child.name}/" if child.is_dir() else child.name
        assert name in block, name


def test_every_option_has_a_description():
    """The options table (docs/options.md) comes from ollapy/options.py: a new option needs its line in
    ``OPTION_HELP`` (the generator refuses an undocumented one)."""
    from ollapy.options import OPTION_HELP, Options

    assert sorted(set(Options.names()) - set(OPTION_HELP)) == [], "add them to ollapy.options.OPTION_HELP"
    assert sorted(set(OPTION_HELP) - set(Options.names())) == [], "OPTION_HELP names options that do not exist"


ENV_NAME = re.compile(r"\bOLLAPY_[A-Z][A-Z0-9_]*\b")


def test_every_ollapy_variable_read_anywhere_is_in_the_settings_page():
    """An ``OLLAPY_*`` name in the package or the scripts is a setting (docs/settings.md, generated from
    ollapy/settings.py), a script's variable (the page's second table) or one ollapy sets for its children."""
    from ollapy.settings import INTERNAL_VARIABLES, SCRIPT_SETTINGS, SETTINGS

    files = [*(ROOT / "ollapy").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "scripts").glob("*.sh")]
    used = {name: f.relative_to(ROOT) for f in files for name in ENV_NAME.findall(f.read_text(errors="replace"))}
    used.pop("OLLAPY_X", None)  # ollapy/config.py's docstring: the shape of a setting error, not a variable
    known = {*SETTINGS, *SCRIPT_SETTINGS, *INTERNAL_VARIABLES}
    assert {n: str(f) for n, f in used.items() if n not in known} == {}
    page = (DOCS / "settings.md").read_text()
    assert [n for n in (*SETTINGS, *SCRIPT_SETTINGS) if f"`{n}`" not in page] == []


METRIC_NAME = re.compile(r"\bollapy_[a-z][a-z0-9_]*\b")


def test_every_metric_a_page_names_is_a_series_the_server_exposes():
    """PromQL written from the docs works: each ``ollapy_*`` metric a page names is a series ``/metrics`` exposes
    (a counter with its ``_total``), as the generated list in docs/metrics.md has them."""
    listed = (DOCS / "metrics.md").read_text().split("<!-- BEGIN metrics -->")[1].split("<!-- END metrics -->")[0]
    series = set(re.findall(r"`(ollapy_[a-z0-9_]+)`", listed))
    assert "ollapy_requests_total" in series and "ollapy_time_to_first_token_seconds_bucket" in series
    bad = []
    for page in _pages():
        for name in set(METRIC_NAME.findall(page.read_text())) - series - {"ollapy_version"}:  # /api/version's field
            bad.append(f"{page.relative_to(ROOT)}: {name}")
    assert bad == []
