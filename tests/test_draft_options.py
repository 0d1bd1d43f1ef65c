"""Speculative-decoding options (``draft``, ``draft_num_predict``, ``draft_min``) and the Modelfile ``DRAFT``
instruction: parsing, what is load-time, and ``create``/``show --modelfile`` through the CLI."""
from __future__ import annotations

import pytest
from conftest import live_server, run_cli

from ollapy.errors import OptionError, UsageError
from ollapy.options import DRAFT_N_MAX_MODEL, DRAFT_N_MAX_NGRAM, Options, api_options, draft_limit, draft_model, parse_options
from ollapy.store.modelfile import format_modelfile, parse_modelfile


def test_defaults_follow_ollama():
    o = Options()
    assert (o.draft, o.draft_num_predict, o.draft_min) == ("", -1, 1)


def test_an_unset_draft_num_predict_is_long_for_ngram_and_ollamas_4_for_a_draft_model():
    """n-gram proposals cost nothing to make (llama.cpp's n-gram modes draft up to 48-64), a draft model's cost a
    decode each (Ollama: 4); a set value holds for both, 0 drafts nothing."""
    assert (DRAFT_N_MAX_NGRAM, DRAFT_N_MAX_MODEL) == (16, 4)
    assert draft_limit("ngram", -1) == 16 and draft_limit("draft.gguf", -1) == 4
    assert draft_limit("ngram", 6) == 6 and draft_limit("draft.gguf", 6) == 6 and draft_limit("ngram", 0) == 0


def test_a_draft_min_above_what_a_step_verifies_is_refused_in_one_line():
    with pytest.raises(OptionError, match=r"draft_min \(5\) is above draft_num_predict \(4\)") as e:
        Options().merged({"draft": "ngram", "draft_num_predict": 4, "draft_min": 5})
    assert "lower draft_min or raise draft_num_predict" in e.value.hint and "\n" not in str(e.value)
    with pytest.raises(OptionError, match=r"draft_min \(6\) is above draft_num_predict \(4\)"):
        Options().merged({"draft": "d.gguf", "draft_min": 6})  # a draft model's default cap
    assert Options().merged({"draft": "ngram", "draft_min": 6}).draft_min == 6  # under n-gram's 16
    assert Options().merged({"draft_min": 9, "draft_num_predict": 2}).draft_min == 9  # drafting off: no matter


@pytest.mark.parametrize(("text", "value"), [
    ("ngram", "ngram"), (" NGRAM ", "ngram"), ("", ""), ("none", ""), ("off", ""),
    ("./Draft-Q8.gguf", "./Draft-Q8.gguf"), ("hf.co/Org/SmolLM2:Q8_0", "hf.co/Org/SmolLM2:Q8_0"),
])
def test_cli_reads_draft_as_off_ngram_or_a_model_keeping_its_case(text, value):
    assert parse_options([f"draft={text}"]) == {"draft": value}


def test_draft_lengths_are_bounded_counts():
    assert parse_options(["draft_num_predict=8", "draft_min=2"]) == {"draft_num_predict": 8, "draft_min": 2}
    assert parse_options(["draft_num_predict=0"]) == {"draft_num_predict": 0}  # 0 drafts nothing
    for bad, match in [("draft_min=0", "draft_min must be at least 1"),
                       ("draft_num_predict=65", "draft_num_predict must be at most 64"),
                       ("draft_num_predict=two", "draft_num_predict expects int")]:
        with pytest.raises(OptionError, match=match):
            parse_options([bad])


def test_the_api_takes_draft_options_and_refuses_wrong_types():
    assert api_options({"draft": "ngram", "draft_num_predict": 6, "draft_min": None}) == \
        {"draft": "ngram", "draft_num_predict": 6}
    with pytest.raises(OptionError, match="option draft expects str"):
        api_options({"draft": 3})


def test_only_a_draft_model_is_load_time():
    base = Options()
    assert draft_model("") == "" and draft_model("ngram") == "" and draft_model("d.gguf") == "d.gguf"
    assert base.merged({"draft": "ngram", "draft_num_predict": 8}).load_key() == base.load_key()
    assert base.merged({"draft": "/m/draft.gguf"}).load_key() != base.load_key()
    assert base.merged({"draft": "/m/a.gguf"}).load_key() != base.merged({"draft": "/m/b.gguf"}).load_key()


def test_modelfile_draft_instruction_is_the_draft_option():
    mf = parse_modelfile("FROM ./target.gguf\nDRAFT ./draft.gguf\nPARAMETER draft_num_predict 6\n")
    assert mf.parameters == {"draft": "./draft.gguf", "draft_num_predict": 6}
    assert parse_modelfile("FROM x\nPARAMETER draft ngram\n").parameters == {"draft": "ngram"}
    assert parse_modelfile("FROM x\ndraft m1\nPARAMETER draft ngram\n").parameters == {"draft": "ngram"}  # last wins
    text = format_modelfile("x.gguf", {"draft": "/m/draft.gguf", "draft_min": 2}, None, None, None, [])
    assert text == "FROM x.gguf\nDRAFT /m/draft.gguf\nPARAMETER draft_min 2\n"
    assert parse_modelfile(text).parameters == {"draft": "/m/draft.gguf", "draft_min": 2}
    assert format_modelfile("x", {"draft": "ngram"}, None, None, None, []) == 'FROM x\nPARAMETER draft "ngram"\n'


@pytest.mark.parametrize(("text", "match"), [
    ("FROM x\nDRAFT", "line 2: DRAFT needs a model name"),
    ("FROM x\nPARAMETER draft_min 0", "line 2: option draft_min must be at least 1"),
    ("FROM x\nDRAFTS y", "unknown instruction 'DRAFTS'"),
])
def test_modelfile_draft_errors_name_the_line(text, match):
    with pytest.raises(UsageError, match=match):
        parse_modelfile(text)


def test_create_resolves_a_relative_draft_path_and_show_prints_it(smollm2_path, tmp_path):
    (tmp_path / "draft.gguf").symlink_to(smollm2_path)
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nDRAFT ./draft.gguf\nPARAMETER draft_num_predict 6\n")
    made = run_cli("create", "spec", "-f", str(tmp_path / "Modelfile"))
    assert made.returncode == 0, made.stderr.decode()
    shown = run_cli("show", "spec", "--modelfile")
    assert shown.returncode == 0, shown.stderr.decode()
    lines = shown.stdout.decode().splitlines()
    assert f"DRAFT {(tmp_path / 'draft.gguf').resolve()}" in lines and "PARAMETER draft_num_predict 6" in lines


def test_the_cli_refuses_a_bad_draft_option_in_one_line(smollm2_path):
    r = run_cli("run", str(smollm2_path), "-o", "draft_min=0", "hi")
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode().splitlines()[0] == "Error: option draft_min must be at least 1, got 0"
    missing = run_cli("run", str(smollm2_path), "-o", "draft=nosuchmodel", "hi")
    lines = missing.stderr.decode().splitlines()
    assert missing.returncode == 1 and missing.stdout == b"" and len(lines) == 1
    assert lines[0].startswith("Error: draft model 'nosuchmodel:latest' not found")
    never = run_cli("run", str(smollm2_path), "-o", "draft=ngram", "-o", "draft_num_predict=2", "-o", "draft_min=3",
                    "hi")
    assert never.returncode == 2 and never.stdout == b""
    assert never.stderr.decode().splitlines()[0] == \
        "Error: draft_min (3) is above draft_num_predict (2): nothing could ever be drafted (lower draft_min or raise " \
        "draft_num_predict)"


@pytest.mark.parametrize(("lines", "code", "error"), [
    ("PARAMETER draft ngram\nPARAMETER draft_min 30\n", 2,
     "Error: draft_min (30) is above draft_num_predict (16): nothing could ever be drafted"),
    ("DRAFT ./draft.gguf\nPARAMETER draft_min 6\n", 2,
     "Error: draft_min (6) is above draft_num_predict (4): nothing could ever be drafted"),
    ("DRAFT ./nope.gguf\n", 1, "Error: draft model ./nope.gguf: no such file"),
    ("DRAFT nosuchdraft\n", 1, "Error: draft model 'nosuchdraft:latest' not found"),
])
def test_create_refuses_a_modelfile_no_run_could_use(smollm2_path, tmp_path, lines, code, error):
    """Found by a fresh-user trial: each of these was created and then failed on every run."""
    (tmp_path / "draft.gguf").symlink_to(smollm2_path)
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\n{lines}")
    made = run_cli("create", "spec-bad", "-f", str(tmp_path / "Modelfile"))
    err = made.stderr.decode().splitlines()
    assert made.returncode == code and err and err[0].startswith(error), made.stderr.decode()
    assert run_cli("show", "spec-bad").returncode == 1  # nothing was created


def test_create_refuses_a_draft_of_another_vocabulary(smollm2_path, gemma_path, tmp_path):
    """Found by a fresh-user trial: ``create`` wrote a model whose DRAFT has another vocabulary, and every run of
    it then failed. The GGUF headers are compared when the model is created (exit 2, nothing written)."""
    (tmp_path / "gemma.gguf").symlink_to(gemma_path)
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nDRAFT ./gemma.gguf\n")
    made = run_cli("create", "spec-other", "-f", str(tmp_path / "Modelfile"))
    err = made.stderr.decode().splitlines()
    assert made.returncode == 2 and err, made.stderr.decode()
    assert err[0] == (f"Error: draft model {gemma_path.resolve()} does not share the vocabulary of {smollm2_path} "
                      "(tokenizer SentencePiece (SPM) vs byte-level BPE) (a draft model must come from the same model "
                      "family and tokenizer as the model)"), err
    assert run_cli("show", "spec-other").returncode == 1  # nothing was created


def test_a_servers_api_never_shows_the_draft_models_path(smollm2_path, smollm2_draft_path, tmp_path):
    """/api/show and /api/ps name a DRAFT given as a file as `<path>`, as the server's errors do: like FROM, never
    a path on the server (found by a fresh-user trial)."""
    import httpx

    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\nDRAFT {smollm2_draft_path}\n")
    env = {"OLLAPY_MODELS": str(tmp_path / "models"), "OLLAPY_CACHE_DIR": str(tmp_path / "cache"),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    made = run_cli("create", "spec", "-f", str(tmp_path / "Modelfile"), env=env)
    assert made.returncode == 0, made.stderr.decode()
    with live_server(tmp_path) as url:
        show = httpx.post(url + "/api/show", json={"model": "spec"}, timeout=60).json()
        assert "DRAFT <path>" in show["modelfile"].splitlines() and 'draft                          "<path>"' in \
            show["parameters"]
        body = {"model": "spec", "prompt": "Hi", "stream": False, "options": {"num_predict": 4, "temperature": 0}}
        assert httpx.post(url + "/api/generate", json=body, timeout=300).status_code == 200
        ps = httpx.get(url + "/api/ps", timeout=60).json()["models"]
        assert [m["draft"] for m in ps] == ["<path>"]
        missing = httpx.post(url + "/api/generate", json=dict(body, options={"draft": "nosuchdraft"}), timeout=300)
        error = missing.json()["error"]  # the name as given, as the CLI's "pull it first: ollapy pull nosuchdraft"
        assert missing.status_code == 404 and error.startswith("draft model") and \
            error.endswith("(try `ollapy pull nosuchdraft`)"), error
        whole = show["modelfile"] + show["parameters"] + str(ps)
        assert str(smollm2_draft_path.parent) not in whole and str(tmp_path) not in whole


def test_a_relative_draft_path_is_made_absolute_by_the_cli_and_a_name_is_kept(tmp_path, monkeypatch):
    """The CLI sends a server an absolute draft path (its working directory is not the user's); names, ``ngram``
    and off pass as typed (`ollapy run`'s rule for the model argument)."""
    from ollapy.cli.embedded import absolute_draft_option

    monkeypatch.chdir(tmp_path)
    assert absolute_draft_option({"draft": "./d.gguf", "top_k": 3}) == {"draft": str(tmp_path / "d.gguf"), "top_k": 3}
    assert absolute_draft_option({"draft": "sub/d.gguf"}) == {"draft": str(tmp_path / "sub" / "d.gguf")}
    for kept in ("smollm2:135m", "ngram", "", "hf.co/org/repo:Q4_K_M"):
        assert absolute_draft_option({"draft": kept}) == {"draft": kept}
    assert absolute_draft_option({"top_k": 3}) == {"top_k": 3}
