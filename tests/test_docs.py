"""The README's command reference and settings table must match the code."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_readme_is_generated_from_current_code():
    p = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr + " — run: python scripts/gen_docs.py"


def test_readme_names_the_ci_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in ci
    assert "bash scripts/quickstart.sh" in readme
