"""LoRA adapters (Modelfile ``ADAPTER``) and ``ollapy create --quantize``, through the real CLI on SmolLM2.

The adapter is a synthetic one (scripts/make_test_lora.py: no PyPI package ships a LoRA for a test model); the
F16 source is the test model dequantized by scripts/make_f16_gguf.py.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

SYSTEM = "You are a concise assistant for a travel agency. " + " ".join(
    f"Rule {i}: answer politely and never invent prices." for i in range(12))
Q = "What is the capital of France? Answer in one word."


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reused(stderr: bytes) -> int:
    m = re.search(rb"prompt cache: +(\d+) token", stderr)
    assert m, stderr.decode()[-800:]
    return int(m.group(1))


def _answer(model: str, *extra: str):
    r = run_cli("run", model, "--verbose", "-o", "temperature=0", "-o", "num_predict=12", "--system", SYSTEM,
                *extra, Q)
    assert r.returncode == 0, r.stderr.decode()[-800:]
    return r.stdout, _reused(r.stderr)


@pytest.fixture(scope="module")
def lora_path(smollm2_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lora") / "smol-lora.gguf"
    return _script("make_test_lora").make_test_lora(out, smollm2_path, seed=1)


def test_an_adapter_changes_the_answer_is_shown_and_never_shares_cache_states(smollm2_path, lora_path, tmp_path):
    (tmp_path / "Base").write_text(f"FROM {smollm2_path}\n")
    (tmp_path / "Lora").write_text(f"FROM {smollm2_path}\nADAPTER ./{lora_path.name}\n")
    (tmp_path / lora_path.name).write_bytes(lora_path.read_bytes())  # relative to the Modelfile, as FROM
    for name in ("base", "lora"):
        r = run_cli("create", name, "-f", str(tmp_path / name.capitalize()))
        assert r.returncode == 0, r.stderr
    base, reused = _answer("base")
    assert reused == 0
    lora_cold, _ = _answer("lora", "--no-cache")
    assert lora_cold != base  # the adapter is applied
    lora, reused = _answer("lora")  # the base model's saved states share every token, but not the salt
    assert reused == 0 and lora == lora_cold
    lora_warm, reused = _answer("lora")
    assert reused > 100 and lora_warm == lora_cold  # the adapter model's own states serve it
    shown = run_cli("show", "lora").stdout.decode()
    assert "Adapters" in shown and "ollapy test LoRA" in shown
    assert "\nADAPTER " in run_cli("show", "lora", "--modelfile").stdout.decode()


def test_an_adapter_for_another_architecture_or_not_an_adapter_is_refused_in_one_line(smollm2_path, gemma_path,
                                                                                      tmp_path):
    other = _script("make_test_lora").make_test_lora(tmp_path / "g.gguf", gemma_path)
    (tmp_path / "M").write_text(f"FROM {smollm2_path}\nADAPTER {other}\n")
    r = run_cli("create", "x", "-f", str(tmp_path / "M"))
    assert r.returncode != 0 and b"an adapter for gemma3 models, not llama" in r.stderr
    (tmp_path / "M").write_text(f"FROM {smollm2_path}\nADAPTER {smollm2_path}\n")
    r = run_cli("create", "x", "-f", str(tmp_path / "M"))
    assert r.returncode != 0 and b"not a LoRA adapter GGUF" in r.stderr and len(r.stderr.splitlines()) == 1


def test_quantize_q8_0_from_f16_makes_a_q8_0_blob_that_answers(smollm2_path, tmp_path):
    f16 = _script("make_f16_gguf").make_f16_gguf(smollm2_path, tmp_path / "smol-f16.gguf")
    (tmp_path / "Modelfile").write_text(f"FROM {f16}\n")
    r = run_cli("create", "smol-q8", "-f", str(tmp_path / "Modelfile"), "--quantize", "Q8_0")
    assert r.returncode == 0, r.stderr
    assert b"quantizing to q8_0 (272 tensors)" in r.stderr and b"272/272" in r.stderr
    show = run_cli("show", "smol-q8").stdout.decode()
    assert re.search(r"quantization\s+Q8_0", show), show
    blob = Path(re.search(r"file\s+(\S+)", show).group(1))
    assert blob.name.startswith("sha256-") and blob.stat().st_size < f16.stat().st_size * 0.6
    answer, _ = _answer("smol-q8", "--no-cache")
    assert b"Paris" in answer
    (tmp_path / "Quantized").write_text(f"FROM {smollm2_path}\n")
    r = run_cli("create", "no", "-f", str(tmp_path / "Quantized"), "-q", "q4_K_M")
    assert r.returncode != 0
    assert b"quantization is only supported for F16 and F32 models" in r.stderr
    r = run_cli("create", "no", "-f", str(tmp_path / "Modelfile"), "-q", "q9_9")
    assert r.returncode == 2 and b"supported types are" in r.stderr


def test_api_create_takes_quantize_and_adapters_as_ollamas_client_sends_them(smollm2_path, lora_path, tmp_path):
    """Through the official ollama client: an F16 blob quantized to q8_0 with a LoRA blob attached, progress
    counted in tensors; the answer differs from the plain quantized model's; /api/show names the adapter."""
    import httpx
    import ollama
    from conftest import live_server

    f16 = _script("make_f16_gguf").make_f16_gguf(smollm2_path, tmp_path / "smol-f16.gguf")
    with live_server(tmp_path / "srv") as url:
        oc = ollama.Client(host=url)
        model, lora = oc.create_blob(f16), oc.create_blob(lora_path)
        steps = list(oc.create(model="q8", files={"m.gguf": model}, quantize="q8_0", stream=True))
        counted = [s for s in steps if s.status == "quantizing model to Q8_0"]
        assert counted and counted[-1].completed == counted[-1].total == 272
        assert steps[-1].status == "success"
        oc.create(model="q8-lora", files={"m.gguf": model}, quantize="q8_0", adapters={"lora.gguf": lora})
        ask = {"prompt": Q, "system": SYSTEM, "options": {"temperature": 0, "num_predict": 12}}
        plain, adapted = (oc.generate(model=m, **ask).response for m in ("q8", "q8-lora"))
        assert "Paris" in plain and adapted != plain
        shown = oc.show("q8-lora")
        assert shown.details.quantization_level == "Q8_0"
        assert "ADAPTER sha256-" in shown.modelfile
        refused = httpx.post(url + "/api/create", json={"model": "no", "files": {"m.gguf": oc.create_blob(smollm2_path)},
                                                        "quantize": "q4_K_M"})  # refused before any stream
        assert refused.status_code == 400
        assert refused.json()["error"].startswith("quantization is only supported for F16 and F32 models")
        legacy = httpx.post(url + "/api/create", json={"model": "no", "modelfile": f"FROM q8\nADAPTER {lora_path}\n"})
        assert legacy.status_code == 400 and "an adapter is an uploaded blob" in legacy.json()["error"]
