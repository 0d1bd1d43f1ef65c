"""Modelfile parsing (Ollama syntax) and ``create``."""
from __future__ import annotations

import pytest

pytest_plugins = ["store_fixtures"]

from ollapy.errors import UsageError
from ollapy.store import create_model, list_models, resolve_model
from ollapy.store.modelfile import format_modelfile, parse_modelfile

TEXT = '''# comment
FROM ./model.gguf
parameter temperature 0.2
PARAMETER stop "<|im_end|>"
PARAMETER stop <|endoftext|>
PARAMETER num_ctx 2048
SYSTEM """You are
a pirate."""
TEMPLATE "{{ .Prompt }}"
LICENSE """MIT"""
MESSAGE user Hi there
MESSAGE assistant """Arr,
matey."""
'''


def test_parse_all_instructions():
    mf = parse_modelfile(TEXT)
    assert mf.from_ == "./model.gguf"
    assert mf.parameters == {"temperature": 0.2, "stop": ["<|im_end|>", "<|endoftext|>"], "num_ctx": 2048}
    assert mf.system == "You are\na pirate." and mf.template == "{{ .Prompt }}" and mf.license == ["MIT"]
    assert mf.messages == [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Arr,\nmatey."}]
    again = parse_modelfile(format_modelfile(mf.from_, mf.parameters, mf.system, mf.template, "MIT", mf.messages))
    assert again.parameters == mf.parameters and again.system == mf.system and again.messages == mf.messages


def test_show_modelfile_round_trips_awkward_parameter_values():
    """Stop strings with quotes, backslashes and non-ASCII survive `show --modelfile` and a re-parse, and are
    written the way Ollama writes them (JSON-quoted, UTF-8 kept, whole floats without '.0')."""
    params = {"stop": ['say "hi"', "back\\slash", "fin ✓", "<|im_end|>"], "temperature": 1.0, "top_p": 0.9}
    text = format_modelfile("x.gguf", params, None, None, None, [])
    assert 'PARAMETER stop "fin ✓"' in text and "PARAMETER temperature 1\n" in text and 'PARAMETER stop "say \\"hi\\""' in text
    assert parse_modelfile(text).parameters == params


@pytest.mark.parametrize(("text", "match"), [
    ("PARAMETER temperature 1", "no FROM"),
    ("FROM x\nPARAMETER nosuch 1", "unknown option"),
    ("FROM x\nPARAMETER temperature hot", "temperature"),
    ("FROM x\nSYSTEM \"\"\"open", "unterminated"),
    ("FROM x\nADAPTER y", "ADAPTER"),
    ("FROM x\nMESSAGE robot hi", "role"),
])
def test_errors(text, match):
    with pytest.raises(UsageError, match=match):
        parse_modelfile(text)


def test_create_links_without_copy(store_env, smollm2_path, tmp_path):
    gguf = tmp_path / "model.gguf"
    try:
        gguf.hardlink_to(smollm2_path)
    except OSError:
        gguf.symlink_to(smollm2_path)
    ref = create_model("pirate", TEXT, tmp_path)
    assert ref.name == "pirate:latest"
    assert ref.system == "You are\na pirate." and ref.parameters["num_ctx"] == 2048
    assert ref.messages[1]["content"] == "Arr,\nmatey."
    assert ref.path.stat().st_ino == smollm2_path.stat().st_ino or ref.path.resolve() == smollm2_path.resolve()
    # create FROM an existing model name inherits and overrides
    ref2 = create_model("pirate2", "FROM pirate\nPARAMETER temperature 0.9\n", tmp_path)
    assert ref2.parameters["temperature"] == 0.9 and ref2.system == ref.system and ref2.digest == ref.digest
    assert sorted(m.name for m in list_models()) == ["pirate2:latest", "pirate:latest"]
    assert resolve_model("pirate", pull=False).digest == ref.digest
