"""Modelfile parsing (Ollama syntax) and ``create``."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ("FROM x\nADAPTER ", "ADAPTER needs the path"),
    ("FROM x\nQUANTIZE q8_0", "unknown instruction"),
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


def test_quoted_values_span_lines_as_in_ollama():
    """A value that opens a quote runs to the line that closes it, as Ollama's parser reads it: nothing inside is
    unescaped, and a triple-quoted value may hold single quotes and blank lines."""
    mf = parse_modelfile('FROM x.gguf\n'
                         'SYSTEM "You are a pirate.\n'
                         'Always answer in one word."\n'
                         'TEMPLATE """{{ .System }}\n'
                         '\n'
                         'say "{{ .Prompt }}"\n'
                         '"""\n'
                         'PARAMETER stop "two\n'
                         'lines"\n'
                         'MESSAGE user "C:\\path \\n stays\n'
                         'raw"\n'
                         'PARAMETER temperature 0\n')
    assert mf.system == "You are a pirate.\nAlways answer in one word."
    assert mf.template == '{{ .System }}\n\nsay "{{ .Prompt }}"\n'
    assert mf.parameters == {"stop": ["two\nlines"], "temperature": 0.0}
    assert mf.messages == [{"role": "user", "content": "C:\\path \\n stays\nraw"}]


def test_unterminated_quote_names_its_line():
    with pytest.raises(UsageError, match="line 2: unterminated quoted string"):
        parse_modelfile('FROM x\nSYSTEM "open\nnever closed\n')


def test_create_and_show_modelfile_with_multiline_system(store_env, smollm2_path, tmp_path):
    from conftest import run_cli

    (tmp_path / "Modelfile").write_text(f'FROM {smollm2_path}\nSYSTEM "You are a pirate.\nAlways answer in one word."\n'
                                        'PARAMETER stop "Arr"\n')
    r = run_cli("create", "pirate", "-f", str(tmp_path / "Modelfile"))
    assert r.returncode == 0, r.stderr
    shown = run_cli("show", "pirate", "--modelfile")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.decode().splitlines()[1:] == ['SYSTEM """You are a pirate.', 'Always answer in one word."""',
                                                      'PARAMETER stop "Arr"']
    again = parse_modelfile(shown.stdout.decode())
    assert again.system == "You are a pirate.\nAlways answer in one word." and again.parameters == {"stop": ["Arr"]}
    (tmp_path / "Modelfile2").write_text(shown.stdout.decode())
    assert run_cli("create", "pirate2", "-f", str(tmp_path / "Modelfile2")).returncode == 0
    assert run_cli("show", "pirate2", "--modelfile").stdout == shown.stdout


_PIECES = ['"', '"""', "\\", "\\n", "\n", "\r", "\r\n", " ", "\t", "#", "a", "Z", "é", "✓", "\u2028", "{{ .Prompt }}",
           "PARAMETER stop x", "\x00"]
_awkward = st.one_of(st.text(), st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))


@settings(max_examples=300, deadline=None)
@given(system=_awkward.filter(bool), template=_awkward.filter(bool), stops=st.lists(_awkward, max_size=4),
       messages=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _awkward), max_size=3),
       license=_awkward.filter(bool))
def test_show_modelfile_output_parses_back_to_the_same_fields(system, template, stops, messages, license):
    params = {"temperature": 0.5, "stop": stops} if stops else {"temperature": 0.5}
    msgs = [{"role": r, "content": c} for r, c in messages]
    mf = parse_modelfile(format_modelfile("x.gguf", params, system, template, license, msgs))
    assert (mf.from_, mf.system, mf.template, mf.parameters, mf.messages, mf.license) == \
        ("x.gguf", system, template, params, msgs, [license])
