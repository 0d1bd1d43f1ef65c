"""Existing Ollama stores are listed and resolved in place (read-only); store modules stay light to import."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ollapy.errors import ModelNotFound
from ollapy.store import copy_model, list_models, pull_model, remove_model, resolve_model

pytest_plugins = ["store_fixtures"]


def test_ollama_store_read_only(store_env, registry, smollm2_path, tmp_path, monkeypatch):
    registry.add_model("library", "tiny", "q4", smollm2_path, system="Be brief.")
    pull_model("tiny:q4", quiet=True)
    ollama = tmp_path / "ollama-models"
    shutil.copytree(store_env, ollama, ignore=shutil.ignore_patterns("locks"))
    shutil.rmtree(store_env)
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    [row] = list_models()
    assert row.name == "tiny:q4" and row.store == "ollama" and row.broken is None
    ref = resolve_model("tiny:q4", pull=False)
    assert ref.path.parent == ollama / "blobs" and ref.system == "Be brief."  # used in place, not copied
    with pytest.raises(ModelNotFound, match="ollama rm"):
        remove_model("tiny:q4")
    copy_model("tiny:q4", "mine:v1")  # refers to the Ollama blob, copies no bytes
    ref2 = resolve_model("mine:v1", pull=False)
    assert ref2.path == ref.path and not (store_env / "blobs").exists()
    assert sorted(m.store for m in list_models()) == ["ollama", "ollapy"]


def test_light_imports():
    code = ("import sys, ollapy.store, ollapy.cli.models_cmd; "
            "bad = [m for m in ('llama_cpp', 'huggingface_hub', 'httpx', 'gguf') if m in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
