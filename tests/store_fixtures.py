"""Fixtures for the model-store tests (``pytest_plugins = ["store_fixtures"]`` or import from conftest).

* ``smollm2_path``: the real SmolLM2 test GGUF (fetched by scripts/fetch_test_models.py,
  located via its ``default_dir()`` / ``OLLAPY_TEST_MODELS``); skips when absent.
* ``store_env``: a temporary, empty ``OLLAPY_MODELS`` and ``OLLAMA_MODELS``; returns the store root.
* ``registry``: a running :class:`fake_registry.FakeRegistry` that names without a host pull from.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_registry import FakeRegistry


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_test_models", ROOT / "scripts" / "fetch_test_models.py")
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_model_path(name: str) -> Path | None:
    """Path of a fetched, size-checked test model, or None."""
    mod = _fetch_module()
    model = next(m for m in mod.MODELS if m.name == name)
    p = mod.default_dir() / model.filename
    return p if p.is_file() and p.stat().st_size == model.size else None


test_model_path.__test__ = False  # not a test


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M Q4_1 GGUF."""
    p = test_model_path("smollm2")
    if p is None:
        pytest.skip("run `python scripts/fetch_test_models.py` first")
    return p


@pytest.fixture
def store_env(tmp_path, monkeypatch) -> Path:
    """Empty OLLAPY_MODELS (and OLLAMA_MODELS) under tmp_path; returns the store root."""
    root = tmp_path / "store"
    monkeypatch.setenv("OLLAPY_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama-none"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("OLLAPY_PULL_RETRIES", "6")
    from ollapy.store import download, hf

    monkeypatch.setattr(download, "BACKOFF_S", 0.01)
    hf._REACH.clear()
    return root


@pytest.fixture
def registry(monkeypatch):
    """A FakeRegistry on loopback; OLLAPY_REGISTRY points at it."""
    with FakeRegistry() as reg:
        monkeypatch.setenv("OLLAPY_REGISTRY", reg.url)
        yield reg


def make_split_gguf(src: Path, dst: Path, n_parts: int) -> list[Path]:
    """Split a GGUF like ``llama-gguf-split`` (``model-0000i-of-0000n.gguf``, ``split.*`` keys) with gguf-py's writer."""
    import gguf

    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst / "model.gguf"), arch, split_max_tensors=-(-len(reader.tensors) // n_parts))
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        writer.add_key_value(field.name, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return sorted(dst.glob("model-*-of-*.gguf"))


@pytest.fixture(scope="session")
def smollm2_split(smollm2_path, tmp_path_factory) -> list[Path]:
    """The real SmolLM2 GGUF split into 3 loadable parts (gguf-split naming and metadata)."""
    return make_split_gguf(smollm2_path, tmp_path_factory.mktemp("split"), 3)
