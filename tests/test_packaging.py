"""The built wheel: every subpackage and the catalogue travel with it, and an installed copy finds its catalogue."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"pip wheel failed: {proc.stderr[-2000:]}")
    return next(out.glob("ollapy-*.whl"))


def test_wheel_carries_every_subpackage_and_catalogue_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for init in ROOT.glob("ollapy/**/__init__.py"):
        assert init.relative_to(ROOT).as_posix() in names, f"{init} missing from the wheel: add it to pyproject's packages"
    for toml in (ROOT / "models").glob("*.toml"):
        assert f"ollapy/models/{toml.name}" in names


def test_wheel_carries_the_chat_page(wheel):
    """Every file the chat page serves (ollapy/web: the page, its modules, the vendored libraries and their
    VERSIONS and licenses) is in the wheel: ``pip install`` gives a working page, with no build step."""
    names = set(zipfile.ZipFile(wheel).namelist())
    page = [p for p in (ROOT / "ollapy" / "web").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.name == "index.html" for p in page) and any(p.name == "VERSIONS" for p in page)
    missing = [p.relative_to(ROOT).as_posix() for p in page if p.relative_to(ROOT).as_posix() not in names]
    assert missing == [], "add them to pyproject's package-data for ollapy.web"


def test_installed_copy_resolves_catalogue_aliases(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from ollapy.store import catalogue; d = catalogue.catalogue_dir(); "
            "e = catalogue.lookup(__import__('ollapy.store.names', fromlist=['x']).parse_name('smollm2:135m')); "
            "print(d); print(e.file, e.sha256)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("OLLAPY_CATALOGUE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    where, entry = out.stdout.splitlines()
    assert Path(where) == site / "ollapy" / "models"
    assert entry.startswith("SmolLM2-135M-Instruct.Q4_1.gguf b179c952")
