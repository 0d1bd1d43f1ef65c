"""Vision models in the store: an HF repo's mmproj comes with ``pull``, an Ollama registry manifest's projector
layer is pulled and used, ``list`` counts the projector and ``rm`` removes it."""
from __future__ import annotations

from pathlib import Path

import pytest
from fake_hf import FakeHF

pytest_plugins = ["store_fixtures"]

from ollapy.store import list_models, remove_model, resolve_model  # noqa: E402
from ollapy.store.hf import select_projector  # noqa: E402
from tests.test_vision_engine import _script  # noqa: E402


@pytest.fixture
def projector(tmp_path) -> Path:
    return _script().write_projector(tmp_path / "mmproj-test.gguf", "gemma3", 0, 576)


def test_select_projector():
    files = ["mmproj-model-f16.gguf", "mmproj-model-Q8_0.gguf", "mmproj-model-f32.gguf"]
    assert select_projector(files, "model-Q8_0.gguf") == "mmproj-model-Q8_0.gguf"
    assert select_projector(files, "model-Q4_K_M.gguf") == "mmproj-model-f16.gguf"
    assert select_projector(["mmproj-x.gguf"], "m-Q4_0.gguf") == "mmproj-x.gguf"
    assert select_projector([], "m.gguf") is None


def test_hf_pull_fetches_the_mmproj(store_env, smollm2_path, projector, monkeypatch):
    other = _script().write_projector(projector.with_name("other.gguf"), "gemma3", 1, 576)
    repos = {"org/Vision-GGUF": {"SmolVLM-Q4_1.gguf": smollm2_path, "mmproj-SmolVLM-F16.gguf": projector,
                                 "mmproj-SmolVLM-F32.gguf": other}}
    with FakeHF(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        ref = resolve_model("hf.co/org/Vision-GGUF:Q4_1", quiet=True)
    assert ref.projector is not None and ref.projector.read_bytes() == projector.read_bytes()
    [info] = list_models()
    assert info.size == smollm2_path.stat().st_size + projector.stat().st_size
    remove_model("hf.co/org/Vision-GGUF:Q4_1")
    assert list_models() == []


def test_registry_projector_layer_is_pulled_and_counted(store_env, registry, smollm2_path, projector):
    manifest = registry.add_model("library", "vis", "latest", smollm2_path)
    manifest["layers"].append({"mediaType": "application/vnd.ollama.image.projector", **registry.add_blob(projector)})
    ref = resolve_model("vis", quiet=True)
    assert ref.projector is not None and ref.projector.read_bytes() == projector.read_bytes()
    [info] = list_models()
    assert info.size == smollm2_path.stat().st_size + projector.stat().st_size
    blob = ref.projector
    removed = remove_model("vis")
    assert len(removed) >= 2 and not blob.exists()  # the projector's blob goes with the model
