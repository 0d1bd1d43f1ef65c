"""The first answer a new user sees: scripts/quickstart.sh's own commands on the catalogue's smollm2:135m, and how
the repeat penalty treats a grammar's structure tokens (``--format schema.json``)."""
from __future__ import annotations

import json
import os
import shlex

from conftest import ROOT, run_cli

SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _quickstart_commands() -> list[list[str]]:
    """The ``ollapy pull`` and the first ``ollapy run`` of scripts/quickstart.sh, as argument lists."""
    out = []
    for line in (ROOT / "scripts" / "quickstart.sh").read_text().splitlines():
        words = shlex.split(line) if line.startswith('"$OLLAPY" ') else []
        if words[1:2] in (["pull"], ["run"]):
            out.append(words[1:])
    return out[:2]


def _seed_blob(store, smollm2_path) -> None:
    """Put the test model's file in the empty store as the catalogue's blob, so `pull` needs no network (it
    still writes the catalogue entry's manifest with its parameters, as a download would)."""
    blobs = store / "blobs"
    blobs.mkdir(parents=True)
    try:
        os.link(smollm2_path, blobs / f"sha256-{SMOL_SHA}")
    except OSError:
        os.symlink(smollm2_path, blobs / f"sha256-{SMOL_SHA}")


def test_quickstart_answers_paris_with_the_catalogue_parameters(smollm2_path, tmp_path):
    store = tmp_path / "models"
    _seed_blob(store, smollm2_path)
    env = {"OLLAPY_MODELS": str(store)}
    pull, run = _quickstart_commands()
    assert pull == ["pull", "smollm2:135m"] and run[:2] == ["run", "smollm2:135m"]
    assert run[-1] == "What is the capital of France? Answer in one word."
    r = run_cli(*pull, env=env)
    assert r.returncode == 0, r.stderr
    shown = run_cli("show", "smollm2:135m", "--parameters", env=env).stdout.decode().splitlines()
    assert [" ".join(line.split()) for line in shown] == [
        'repeat_penalty 1', 'stop "<|im_end|>"', "temperature 0.2", "top_p 0.9"]
    r = run_cli(*run, env=env)
    answer = r.stdout.decode().strip()
    assert r.returncode == 0, r.stderr
    # the right answer, and no paragraph around it (Ollama's default repeat_penalty 1.1 gives one: see below)
    assert "Paris" in answer and len(answer.split()) <= 8 and "\n" not in answer, answer
    # the same command with Ollama's default penalty instead of the catalogue's: the reason for the parameter
    r = run_cli(*run[:-1], "-o", "repeat_penalty=1.1", run[-1], env=env)
    assert len(r.stdout.decode().split()) > 8, r.stdout


def test_repeat_penalty_never_applies_to_json_structure_tokens(smollm2_path, tmp_path):
    """Under a grammar, quotes, commas, colons and braces never enter the penalty window: even a strong penalty
    leaves the JSON's structure alone (with it, the closing quote of "Paris" was penalized away and the string
    ran on until num_predict)."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string"},
                                                                   "country": {"type": "string"}},
                                  "required": ["city", "country"]}))
    for penalty in ("1.1", "3"):
        r = run_cli("run", str(smollm2_path), "--format", str(schema), "-o", "temperature=0", "-o", "num_predict=60",
                    "-o", f"repeat_penalty={penalty}", "What is the capital of France? Answer in one word.")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"city": "Paris", "country": "France"}, (penalty, r.stdout)


def test_structure_tokens_are_json_punctuation_and_blanks_only(smollm2_path):
    from ollapy.engine.backend.context import Backend, ContextConfig
    from ollapy.engine.sampler import structure_tokens

    b = Backend(smollm2_path, ContextConfig(n_parallel=1, num_ctx=64))
    try:
        exempt = structure_tokens(b)
        pieces = {b.token_piece(t) for t in exempt}
        assert {b'"', b'",', b"{", b"}", b":", b","} <= pieces
        assert all(set(p) <= set(b'{}[]:,"' + b" \t\r\n") for p in pieces)
        assert not set(b.tokenize(' "Paris", France', add_special=False)) <= exempt  # words stay penalized
        assert structure_tokens(b) is exempt  # one pass per loaded model
    finally:
        b.close()
