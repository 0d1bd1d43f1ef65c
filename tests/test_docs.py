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
