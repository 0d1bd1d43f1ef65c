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


def test_modelfile_with_two_froms_makes_a_vision_model(store_env, smollm2_path, projector, tmp_path):
    from ollapy.errors import UsageError
    from ollapy.store.resolve import create_model
    from tests.conftest import run_cli

    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nFROM ./mmproj-test.gguf\nPARAMETER temperature 0\n")
    ref = create_model("vis2", (tmp_path / "Modelfile").read_text(), tmp_path, quiet=True)
    assert ref.projector is not None and ref.projector.read_bytes() == projector.read_bytes()
    r = run_cli("show", "vis2")
    out = r.stdout.decode()
    assert r.returncode == 0 and "vision" in out and "Projector" in out and "gemma3" in out
    assert run_cli("show", "vis2", "--modelfile").stdout.decode().splitlines()[1].startswith("FROM ")
    ref3 = create_model("vis3", "FROM vis2\nSYSTEM hi\n", tmp_path, quiet=True)  # a model made FROM it keeps it
    assert ref3.projector is not None
    with pytest.raises(UsageError, match="not a vision projector"):
        create_model("bad", f"FROM {smollm2_path}\nFROM {smollm2_path}\n", tmp_path, quiet=True)
