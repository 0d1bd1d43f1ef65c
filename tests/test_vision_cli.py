"""Images through ``ollapy run``: ``--image``, image paths in the prompt, piped text plus a path, the REPL's
path finding, ``--verbose``'s image encode duration, and the CLI's errors."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ollapy.cli.images import extract_image_paths
from tests.conftest import run_cli
from tests.test_vision_engine import _script, picture
from tests.test_vision_server import install_vision_model

GREEDY = ("-o", "temperature=0", "-o", "num_predict=6", "-o", "num_ctx=512")


@pytest.fixture
def vis(smollm2_path, tmp_path) -> Path:
    proj = _script().write_projector(tmp_path / "mmproj.gguf", "gemma3", 0, 576)
    install_vision_model(Path(os.environ["OLLAPY_MODELS"]), smollm2_path, proj)
    (tmp_path / "cat.png").write_bytes(picture(1))
    (tmp_path / "same.bmp").write_bytes(picture(1, "BMP"))
    (tmp_path / "dog.png").write_bytes(picture(2))
    return tmp_path


def run(*args, **kw):
    r = run_cli("run", "vis", *GREEDY, *args, **kw)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def test_extract_image_paths(tmp_path):
    (tmp_path / "a b.png").write_bytes(b"x")
    (tmp_path / "c.JPG").write_bytes(b"x")
    text, paths = extract_image_paths(f"What is in {tmp_path}/a\\ b.png and '{tmp_path}/c.JPG'? not.png stays")
    assert paths == [tmp_path / "a b.png", tmp_path / "c.JPG"]
    assert text == "What is in and ? not.png stays"


def test_paths_in_prompt_and_image_flag_agree(vis):
    rc, by_path, err = run(f"What is in {vis}/cat.png?", "--verbose")
    assert rc == 0, err
    assert f"Added image '{vis}/cat.png'" in err and "image encode duration:" in err
    rc, by_flag, err = run("What is in ?", "--image", str(vis / "same.bmp"))
    assert rc == 0, err
    assert by_flag == by_path  # equal pixels as BMP: the same answer
    rc, other, _ = run(f"What is in {vis}/dog.png?")
    assert rc == 0 and other != by_path


def test_piped_text_plus_image_path(vis):
    rc, out, err = run(f"{vis}/cat.png", input="Describe this picture.")
    assert rc == 0 and out.strip(), err
    assert "Added image" in err


def test_bad_image_file_is_a_usage_error(vis):
    (vis / "broken.png").write_bytes(picture(3)[:50])
    rc, _, err = run("x", "--image", str(vis / "broken.png"))
    assert rc == 2 and "could not be decoded" in err
    rc, _, err = run("x", "--image", str(vis / "missing.png"))
    assert rc == 2 and "cannot read the image" in err


def test_model_without_projector(smollm2_path, vis):
    r = run_cli("run", str(smollm2_path), "x", "--image", str(vis / "cat.png"))
    assert r.returncode == 2 and "does not support vision" in r.stderr.decode()


def test_repl_finds_image_paths(vis):
    import sys

    import pexpect

    env = dict(os.environ, OLLAPY_NOHISTORY="1")
    root = Path(__file__).resolve().parents[1]
    c = pexpect.spawn(sys.executable, ["-m", "ollapy.cli.main", "run", "vis", *GREEDY], env=env, encoding="utf-8",
                      timeout=120, cwd=str(root), dimensions=(40, 200))
    c.expect_exact(">>> ")
    c.sendline(f"What is in {vis}/cat.png ?")
    c.expect_exact(f"Added image '{vis}/cat.png'")
    c.expect_exact(">>> ")
    c.sendline("/bye")
    c.expect(pexpect.EOF)


def _reused(err: str) -> int:
    line = next(ln for ln in err.splitlines() if ln.startswith("prompt cache:"))
    return int(line.split()[2])


@pytest.mark.parametrize("runner", ["inproc", "process"])
def test_image_prompt_cached_across_processes_equals_cold(vis, runner):
    env = {"OLLAPY_RUNNER": runner} if runner == "process" else None
    q = f"What is in {vis}/cat.png?"
    rc, cold, err = run(q, "--no-cache", "--verbose", env=env)
    assert rc == 0, err
    rc, first, err = run(q, "--verbose", env=env)
    assert rc == 0, err
    rc, again, err = run(f"What is in {vis}/same.bmp?", "--verbose", env=env)  # a new process, equal pixels
    assert rc == 0, err
    assert _reused(err) > 16 and "cache" in err.split("prompt cache:")[1].splitlines()[0]
    assert cold == first == again
