"""Import rules of docs/design/DESIGN.md, checked by parsing every module with ``ast``."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "ollapy"
# the llama.cpp boundary: the only package whose modules import llama_cpp (docs/design/DESIGN.md)
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


# Layers, top to bottom (docs/design/DESIGN.md, docs/design/architecture.md). A module may import its own package and
# packages of a lower rank; engine/ and cache/ share a rank and never import each other (they meet through
# engine/prefix/source.py's PrefixSource Protocol). The shared modules below rank 0 are open to every layer.
# web/ is the chat page's static files (no imports of its own), at rank 0: every layer above may name it.
LAYERS = {"cli": 6, "server": 5, "runner": 4, "engine": 3, "cache": 3, "store": 2, "chat": 1, "web": 0}
SHARED = {"config", "settings", "options", "option_help", "errors", "duration", "fsutil", "rpc_endpoint", "tokens", "kvformat",
          "surrogates", "__init__"}


def _layer_of(path: Path) -> str:
    parts = path.relative_to(PKG).parts
    return parts[0] if len(parts) > 1 else parts[0][:-3]


def _layer_violations(path: Path) -> list[str]:
    """Imports of ``path`` that point sideways or up, as ``module -> target``."""
    me = _layer_of(path)
    rank = LAYERS.get(me, 0)
    out = []
    for target in sorted(_relative_targets(path)):
        if target == me or target in SHARED:
            continue
        if target not in LAYERS or LAYERS[target] >= rank:
            out.append(f"{path.relative_to(ROOT)} -> {target}")
    return out


def test_every_module_of_every_layer_imports_only_downwards():
    """All of ``ollapy/``, not a list of files: each module's imports point to a lower layer or a shared module."""
    seen = {_layer_of(p) for p in PKG.rglob("*.py")}
    assert seen <= set(LAYERS) | SHARED | {"_layering_probe_tmp"}, seen - set(LAYERS) - SHARED
    offenders = [v for p in PKG.rglob("*.py") for v in _layer_violations(p)]
    assert offenders == []


def test_the_layer_rule_catches_an_engine_module_importing_the_cache(tmp_path):
    """The rule itself can fail: a probe under engine/prefix/ importing ``ollapy.cache.index`` is reported."""
    probe = PKG / "engine" / "prefix" / "_layering_probe_tmp.py"
    probe.write_text("from ollapy.cache.index import BlockIndex\n")
    try:
        assert _layer_violations(probe) == ["ollapy/engine/prefix/_layering_probe_tmp.py -> cache"]
    finally:
        probe.unlink()


def test_engine_and_cache_know_nothing_of_http_or_terminals():
    """Below the server, nothing imports a web framework or the CLI's; the engine, the cache and the chat layer
    not even an HTTP client or a terminal library (the store downloads with httpx and draws progress with rich)."""
    banned = {"fastapi", "uvicorn", "starlette", "typer", "rich", "httpx", "click"}
    for sub in ("engine", "cache", "chat", "runner", "store"):
        ban = banned - {"httpx", "rich"} if sub == "store" else banned
        for path in (PKG / sub).rglob("*.py"):
            assert not (_imports(path) & ban), path


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


# ---- the runner interface (docs/design/DESIGN.md): callers hold a ModelRunner and never reach inside it ----------
RUNNER_INSIDES = ("engine", "cache", "backend")
# `.cache` of these is not a runner's: a RunnerSnapshot's prompt-cache figures, a request body's or the CLI
# settings' `cache` flag
NOT_A_RUNNER = frozenset({"snap", "body", "settings"})


def _runner_insides(path: Path) -> list[str]:
    """``X.engine``, ``X.backend``, ``X.cache`` (and ``getattr(X, "engine")``...) in a module, as ``LINE: code``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RUNNER_INSIDES:
            receiver = node.value
            name = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
            if node.attr == "cache" and (name in NOT_A_RUNNER or name.endswith("snapshot")):
                continue
            out.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in RUNNER_INSIDES
              and not (isinstance(node.args[0], ast.Name) and node.args[0].id in NOT_A_RUNNER)):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_callers_outside_the_engine_never_reach_into_a_runner():
    """CLI, server, runtime, loader and runner/ use the ModelRunner Protocol only: no ``.engine``, ``.cache`` or
    ``.backend`` of a model (the prompt cache binds to the model below the interface, so cache/ is exempt)."""
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).parts[0] in ("engine", "cache"):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{hit}" for hit in _runner_insides(path)]
    assert offenders == []


def test_runner_insides_rule_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(model, entry, body, snap):\n    model.engine.stats()\n    entry.model.cache.snapshot()\n"
                     "    n = model.backend.num_ctx\n    getattr(model, 'cache', None)\n"
                     "    return body.cache, snap.cache\n")
    assert sorted(int(h.split(":")[0]) for h in _runner_insides(probe)) == [2, 3, 4, 5]


def test_both_runners_have_every_member_of_the_protocol_with_the_same_parameters():
    """A static check of the runner interface: LoadedModel and ProcessModel define each ModelRunner member (the
    data attributes are set in ``__init__``), and each method takes the Protocol's parameters, in order."""
    import inspect

    from ollapy.engine.interface import ModelRunner
    from ollapy.engine.model import LoadedModel
    from ollapy.runner.process import ProcessModel

    members = {n for n in vars(ModelRunner) if not n.startswith("_") or n in ("__enter__", "__exit__")}
    members |= set(ModelRunner.__annotations__)
    for cls in (LoadedModel, ProcessModel):
        init = inspect.getsource(cls.__init__)
        for name in sorted(members):
            if name in ModelRunner.__annotations__:
                assert f"self.{name} =" in init or hasattr(cls, name), (cls.__name__, name)
                continue
            proto, impl = getattr(ModelRunner, name), getattr(cls, name)
            if isinstance(proto, property):
                assert isinstance(impl, property), (cls.__name__, name)
                continue
            want = [p.name for p in inspect.signature(proto).parameters.values()]
            have = [p.name for p in inspect.signature(impl).parameters.values()]
            assert have[:len(want)] == want or want[-1:] == ["kw"] and have[:len(want) - 1] == want[:-1], \
                (cls.__name__, name, have, want)


def _absolute_imports(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved to ``ollapy.…`` names (``from . import x`` gives
    ``ollapy.pkg.x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = ["ollapy", *path.relative_to(PKG).parts[:-1]]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_cli_server_and_runtime_reach_the_backend_only_through_the_core():
    """``info``, ``rpc-server``, ``ps`` figures...: ``ollapy.engine.system`` and the runner interface, never
    ``ollapy.engine.backend`` (the llama.cpp boundary) itself."""
    callers = [*(PKG / "cli").rglob("*.py"), *(PKG / "server").rglob("*.py"), *(PKG / "runner").rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)} -> {m}" for p in callers for m in sorted(_absolute_imports(p))
                 if m == "ollapy.engine.backend" or m.startswith("ollapy.engine.backend.")]
    assert offenders == []


def test_the_engine_meets_the_cache_only_through_its_prefix_source_protocol():
    """No engine module imports ollapy.cache (engine.py types its cache as engine/prefix/source.py's PrefixSource);
    the cache imports nothing of the engine (it satisfies the Protocol structurally)."""
    for path in (PKG / "engine").rglob("*.py"):
        assert "cache" not in _relative_targets(path), path
    for path in (PKG / "cache").rglob("*.py"):
        assert "engine" not in _relative_targets(path), path


def test_every_package_docstring_maps_its_modules():
    """Each package opens with a docstring that names every module and subpackage in it (``:mod:`.name```)."""
    import ast

    missing = []
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for child in sorted(init.parent.iterdir()):
            name = child.stem if child.suffix == ".py" else child.name
            if name.startswith("_") or (child.is_dir() and not (child / "__init__.py").exists()):
                continue
            if not child.is_dir() and child.suffix != ".py":
                continue
            if f":mod:`.{name}`" not in doc and f":mod:`.{name}." not in doc:
                missing.append(f"{init.relative_to(ROOT)}: {name}")
    assert missing == []
