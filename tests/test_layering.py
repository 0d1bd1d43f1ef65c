"""Import rules of shared/DESIGN.md, checked by parsing every module with ``ast``."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "ollapy"
# the llama.cpp boundary: the only package whose modules import llama_cpp (shared/DESIGN.md)
LLAMA_BOUNDARY = PKG / "engine" / "backend"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _relative_targets(path: Path) -> set[str]:
    """Top-level ollapy subpackages/modules a module imports relatively or absolutely."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(PKG).parts
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-1])[: len(rel) - node.level]
                parts = base + (node.module.split(".") if node.module else [])
                if not parts and node.names:
                    parts = [node.names[0].name]
                if parts:
                    out.add(parts[0])
            elif node.module and node.module.startswith("ollapy."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ollapy."):
                    out.add(a.name.split(".")[1])
    return out


def test_only_the_llama_boundary_imports_llama_cpp():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.is_relative_to(LLAMA_BOUNDARY):
            continue
        if any(m == "llama_cpp" or m.startswith("llama_cpp.") for m in _imports(path)):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    assert "llama_cpp" in _imports(LLAMA_BOUNDARY / "bindings.py")


def test_engine_and_cache_know_nothing_of_http_or_terminals():
    banned = {"fastapi", "uvicorn", "starlette", "typer", "rich", "httpx", "click"}
    for sub in ("engine", "cache"):
        for path in (PKG / sub).rglob("*.py"):
            assert not (_imports(path) & banned), path
            assert not (_relative_targets(path) & {"cli", "server", "runtime", "client"}), path


def test_cli_and_server_do_not_touch_ctypes():
    for sub in ("cli", "server"):
        for path in (PKG / sub).rglob("*.py"):
            assert "ctypes" not in _imports(path), path


def test_help_list_ps_do_not_import_llama_cpp():
    code = (
        "import sys\n"
        "from ollapy.cli.main import app\n"
        "for args in (['--help'], ['run', '--help']):\n"
        "    try:\n"
        "        app(args, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")


def test_core_never_imports_the_cli_or_the_server():
    """Imports point down: runtime, loader, engine, cache, store... know nothing of ``cli`` (nor of ``server``)."""
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        if rel[0] in ("cli", "server"):
            continue
        hit = _relative_targets(path) & {"cli", "server"}
        if hit:
            offenders.append(f"{path.relative_to(ROOT)} -> {sorted(hit)}")
    assert offenders == []


def test_server_never_imports_the_cli():
    for path in (PKG / "server").rglob("*.py"):
        assert "cli" not in _relative_targets(path), path


def test_layering_rule_catches_a_core_to_cli_import():
    """The rule itself can fail: a module under the core importing ollapy.cli is reported."""
    fake = PKG / "_layering_probe_tmp.py"
    fake.write_text("from .cli.runner import absolute_model_arg\n")
    try:
        assert "cli" in _relative_targets(fake)
    finally:
        fake.unlink()
