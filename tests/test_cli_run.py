"""Subprocess tests of ``ollapy run`` on real models: one-shot, pipes, no escape codes, bad input."""
from __future__ import annotations

import re

import pytest
from conftest import run_cli

Q = "What is the capital of France? Answer in one word."


def test_one_shot_prints_answer_and_exits_0(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", Q)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"The capital of France is Paris.\n"
    assert b"\x1b" not in p.stdout + p.stderr and b"\r" not in p.stdout + p.stderr


def test_piped_stdin_without_newline(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", input=Q)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"The capital of France is Paris.\n"


def test_stdin_goes_before_prompt_args(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=30", "--verbose",
                "Answer in one word.", input="What is the capital of France?\n", env={"OLLAPY_DEBUG": "1"})
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    prompt = next(ln for ln in err.splitlines() if "chat prompt" in ln)
    assert prompt.index("What is the capital of France?") < prompt.index("Answer in one word.")
    assert "prompt eval count:" in err and "eval rate:" in err
    assert p.stdout.strip()


def test_empty_stdin_with_prompt_and_invalid_utf8(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", Q, input=b"")
    assert p.returncode == 0 and b"Paris" in p.stdout
    p = run_cli("run", str(smollm2_path), "-o", "temperature=0", "-o", "num_predict=8", input=b"caf\xe9 \xff\xfe hello")
    assert p.returncode == 0, p.stderr
    assert b"not valid UTF-8" in p.stderr
    assert b"Traceback" not in p.stderr


def test_gemma_runs_with_fallback_template(gemma_path):
    p = run_cli("run", str(gemma_path), "-o", "temperature=0", "-o", "num_predict=12", "--verbose",
                "The capital of France is")
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip()) > 0
    n = int(re.search(rb"^\s*eval count:\s+(\d+) token", p.stderr, re.M).group(1))  # not "prompt eval count"
    assert 1 <= n <= 12, p.stderr  # num_predict bounds it; a base model may also end with its EOS


@pytest.mark.parametrize("kind", ["missing", "truncated", "not_gguf", "directory"])
def test_bad_model_files_give_one_line_error(tmp_path, smollm2_path, kind):
    if kind == "missing":
        target = tmp_path / "nope.gguf"
    elif kind == "truncated":
        target = tmp_path / "trunc.gguf"
        with open(smollm2_path, "rb") as f:
            target.write_bytes(f.read(1_000_000))
    elif kind == "not_gguf":
        target = tmp_path / "text.gguf"
        target.write_text("hello, not a model\n")
    else:
        target = tmp_path / "dir.gguf"
        target.mkdir()
    p = run_cli("run", str(target), "hi")
    assert p.returncode == 1, (p.returncode, p.stderr)
    err = p.stderr.decode()
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err


def test_unknown_option_is_usage_error(smollm2_path):
    p = run_cli("run", str(smollm2_path), "-o", "temprature=0", "hi")
    assert p.returncode == 2
    assert b"unknown option 'temprature'" in p.stderr and b"temperature" in p.stderr
    p = run_cli("run", str(smollm2_path), "-o", "num_ctx=abc", "hi")
    assert p.returncode == 2 and b"num_ctx" in p.stderr


def test_format_json_schema_output_parses(smollm2_path, tmp_path):
    import json

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"},
                                  "age": {"type": "integer"}}, "required": ["name", "age"]}))
    p = run_cli("run", str(smollm2_path), "--format", str(schema), "-o", "temperature=0", "-o", "num_predict=200",
                "Give the name and age of a person as JSON.")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout.decode())
    assert isinstance(data["name"], str) and isinstance(data["age"], int)


def test_format_json_starts_an_object(smollm2_path):
    p = run_cli("run", str(smollm2_path), "--format", "json", "-o", "temperature=0", "-o", "num_predict=10", "Hi")
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().lstrip().startswith(("{", "["))
