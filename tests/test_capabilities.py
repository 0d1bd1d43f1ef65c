"""Capabilities as Ollama reports them (``/api/show``, ``ollapy show``) and the shared think/tools check."""
from __future__ import annotations

import json

import httpx
import pytest
from conftest import live_server, run_cli
from test_embeddings import _with_pooling_type
from think_models import THINK_TEMPLATE, think_modelfile

from ollapy.chat.reply import check_capabilities, model_capabilities
from ollapy.errors import OptionError
from ollapy.store.info import embedding_only_meta

TOOLS_TEMPLATE = THINK_TEMPLATE.replace("{%- for", "{%- if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{%- for", 1)


def test_check_capabilities_in_ollamas_words():
    assert check_capabilities("m", can_think=True) is True  # unset: on for a thinking model
    assert check_capabilities("m", can_think=True, think="low") == "low"
    assert check_capabilities("m", can_think=False, think=False) is None  # false: ignored
    with pytest.raises(OptionError) as e:
        check_capabilities("smol", can_think=False, think=True)
    assert e.value.message == '"smol" does not support thinking'
    with pytest.raises(OptionError) as e:
        check_capabilities("smol", can_think=False, think="high")
    assert e.value.message == '"smol" does not support thinking'


def test_model_capabilities_and_embedding_metadata():
    assert model_capabilities(TOOLS_TEMPLATE, embedding_only=False) == ["completion", "tools", "thinking"]
    assert model_capabilities("{{ messages }}", embedding_only=False) == ["completion"]
    assert model_capabilities(TOOLS_TEMPLATE, embedding_only=True) == ["embedding"]
    assert embedding_only_meta({"general.architecture": "llama", "llama.pooling_type": 3})
    assert embedding_only_meta({"general.architecture": "bert"})
    assert embedding_only_meta({"general.architecture": "qwen3", "qwen3.attention.causal": False})
    assert not embedding_only_meta({"general.architecture": "llama", "llama.attention.causal": True})


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_path, qwen_coder_path):
    """A store with smol, smol-think, smol-tools and smol-embed (SmolLM2 plus ``pooling_type``), and coder
    (Qwen2.5-Coder-0.5B: FIM tokens, so ``insert``)."""
    base = tmp_path_factory.mktemp("caps")
    env = {"OLLAPY_MODELS": str(base / "models"), "OLLAPY_HOST": "127.0.0.1:9"}
    _with_pooling_type(smollm2_path, base / "smol-embed.gguf", 3)
    files = {"smol": f"FROM {smollm2_path}\n", "smol-think": think_modelfile(smollm2_path),
             "smol-tools": think_modelfile(smollm2_path).replace(THINK_TEMPLATE, TOOLS_TEMPLATE),
             "smol-embed": f"FROM {base / 'smol-embed.gguf'}\n", "coder": f"FROM {qwen_coder_path}\n"}
    for name, text in files.items():
        (base / f"{name}.Modelfile").write_text(text)
        p = run_cli("create", name, "-f", str(base / f"{name}.Modelfile"), env=env)
        assert p.returncode == 0, p.stderr
    return base, env


EXPECTED = {"smol": ["completion"], "smol-think": ["completion", "thinking"],
            "smol-tools": ["completion", "tools", "thinking"], "smol-embed": ["embedding"],
            "coder": ["completion", "tools", "insert"]}  # `ollapy show` once left insert out


def test_ollapy_show_prints_capabilities(models):
    _, env = models
    for name, caps in EXPECTED.items():
        p = run_cli("show", name, env=env)
        assert p.returncode == 0, p.stderr
        out = p.stdout.decode()
        section = out.split("\n  Capabilities\n", 1)[1].split("\n\n", 1)[0]
        assert section.split() == caps, out


def test_api_show_capabilities_without_loading_and_run_prints_an_embedding(models):
    base, env = models
    with live_server(base) as url:
        for name, caps in EXPECTED.items():
            r = httpx.post(url + "/api/show", json={"model": name})
            assert r.status_code == 200 and r.json()["capabilities"] == caps, (name, r.text)
        assert httpx.get(url + "/api/ps").json()["models"] == []  # show read the GGUF header only
        # `ollapy run EMBEDDING_MODEL text` through the server: the CLI reads the capabilities, prints the vector
        p = run_cli("run", "smol-embed", "a cat sits on the mat", env={**env, "OLLAPY_HOST": url.removeprefix("http://")})
        assert p.returncode == 0, p.stderr
        vec = json.loads(p.stdout)
        assert len(vec) == 576 and abs(sum(v * v for v in vec) - 1) < 1e-4
        assert [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]] == ["smol-embed:latest"]


def test_the_insert_check_reads_a_vocabulary_once_per_file(qwen_coder_path, monkeypatch):
    """Every code completion checks insert support before its load (as Ollama, from the header); reading the
    0.5B's 151k-token vocabulary takes ~140 ms, which each keystroke's request paid (bench_fim: 1.13x
    llama-server's TTFT). It is read once per file version."""
    from types import SimpleNamespace

    import ollapy.store.info as info
    from ollapy.server.ollama.details import ref_supports_insert

    reads = []
    real = info.has_fim_tokens
    monkeypatch.setattr(info, "has_fim_tokens", lambda path: reads.append(path) or real(path))
    ref = SimpleNamespace(path=str(qwen_coder_path), template=None)
    assert all(ref_supports_insert(ref) for _ in range(5)) and len(reads) <= 1, reads
