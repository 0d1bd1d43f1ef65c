"""The patch marker of scripts/install_llama.sh is keyed to the installed library: after `pip install -U
llama-cpp-python` (another version, another libggml-cpu) the build is a stock one, and `ollapy info` says why."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys

import pytest
from conftest import ROOT

from ollapy.engine.backend import bindings

PATCHES = ["sgemm-one-row", "sgemm-one-row-q0-vec-dot"]


@pytest.fixture
def prefix(tmp_path, monkeypatch):
    """A fake ``sys.prefix`` for the marker; the real installed library is what it is compared with."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    bindings.patch_marker.cache_clear()
    yield tmp_path
    bindings.patch_marker.cache_clear()


def _write(prefix, **fields) -> None:
    lib = bindings.patched_library()
    marker = {"patches": PATCHES, "llama_cpp_python": importlib.metadata.version("llama-cpp-python"),
              "library": lib.name, "sha256": hashlib.sha256(lib.read_bytes()).hexdigest(), **fields}
    (prefix / bindings.MARKER).write_text(json.dumps(marker))


def test_a_marker_of_this_library_counts(prefix):
    _write(prefix)
    assert bindings.build_patches() == frozenset(PATCHES)
    assert bindings.patch_marker()[1] == ""


def test_a_marker_of_another_library_file_is_a_stock_build(prefix):
    _write(prefix, sha256="0" * 64)
    assert bindings.build_patches() == frozenset()
    assert "differs" in bindings.patch_marker()[1] and "install_llama.sh" in bindings.patch_marker()[1]
    if bindings.build_has_llamafile():
        assert bindings.one_row_products_differ()


def test_a_marker_of_another_version_is_a_stock_build(prefix):
    _write(prefix, llama_cpp_python="0.0.1")
    assert bindings.build_patches() == frozenset()
    assert "0.0.1" in bindings.patch_marker()[1]


def test_an_unkeyed_marker_is_a_stock_build(prefix):
    """The old marker (patch names only) cannot tell which library it was written for."""
    (prefix / bindings.MARKER).write_text(" ".join(PATCHES) + "\n")
    assert bindings.build_patches() == frozenset()
    assert "re-run scripts/install_llama.sh" in bindings.patch_marker()[1]


def test_no_marker(prefix):
    assert bindings.build_patches() == frozenset() and "no" in bindings.patch_marker()[1]


def test_the_install_script_writes_a_keyed_marker(tmp_path):
    """The marker-writing step of scripts/install_llama.sh, run against this environment's library."""
    script = (ROOT / "scripts" / "install_llama.sh").read_text()
    assert "write_marker" in script
    p = subprocess.run(["bash", "-c", f'set -e; eval "$(sed -n "/^write_marker()/,/^}}/p" {ROOT}/scripts/install_llama.sh)"; '
                        f'PATCHES="{" ".join(PATCHES)}"; write_marker "{sys.executable}" "{tmp_path}/m"'],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    got = json.loads((tmp_path / "m").read_text())
    lib = bindings.patched_library()
    assert got["patches"] == PATCHES and got["sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert got["llama_cpp_python"] == importlib.metadata.version("llama-cpp-python")


def test_info_says_why_a_build_is_stock(prefix):
    if not bindings.build_has_llamafile():
        pytest.skip("a build without tinyBLAS has no one-row split to report")
    from ollapy.engine.system import system_report

    _write(prefix, llama_cpp_python="0.0.1")
    row = system_report("off")["row_invariant"]
    assert row.startswith("no: tinyBLAS declines one-row products (a stock build: the patch marker is for "
                          "llama-cpp-python 0.0.1"), row
    bindings.patch_marker.cache_clear()
    _write(prefix)
    assert "tinyBLAS" not in system_report("off")["row_invariant"]
