"""Name grammar: defaults, HF names, and that no name can reach outside the store."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ollapy.errors import InvalidModelName
from ollapy.store.layout import Store
from ollapy.store.names import looks_like_path, parse_name


@pytest.mark.parametrize(("text", "parts", "display"), [
    ("smollm2", ("registry.ollama.ai", "library", "smollm2", "latest"), "smollm2:latest"),
    ("SmolLM2:135M", ("registry.ollama.ai", "library", "smollm2", "135m"), "SmolLM2:135M"),
    ("me/m:v1", ("registry.ollama.ai", "me", "m", "v1"), "me/m:v1"),
    ("127.0.0.1:5000/ns/m:t", ("127.0.0.1:5000", "ns", "m", "t"), "127.0.0.1:5000/ns/m:t"),
    ("hf.co/Org/Repo-GGUF:Q4_K_M", ("hf.co", "org", "repo-gguf", "q4_k_m"), "hf.co/Org/Repo-GGUF:Q4_K_M"),
    ("huggingface.co/o/r:file.Q4_1.gguf", ("hf.co", "o", "r", "file.q4_1.gguf"), "hf.co/o/r:file.Q4_1.gguf"),
])
def test_parse(text, parts, display):
    n = parse_name(text)
    assert n.parts() == parts and n.display() == display


def test_digest():
    n = parse_name("m:t@sha256:" + "a" * 64)
    assert n.digest == "a" * 64
    with pytest.raises(InvalidModelName):
        parse_name("m:t@sha256:abc")


@pytest.mark.parametrize("bad", ["../x", "a/../b", "/etc/passwd", "a\x00b", "x" * 81, "m:" + "t" * 200, "..", "a//b",
                                 "a/b/c/d", "m:..", "m:../x", "", "https://x/y", "a\\b", "-m", "m:t:u", "ns/.hidden",
                                 "a\n:t", "ns\n/m", "m:t\nx"])
def test_bad_names_one_line_error(bad):
    with pytest.raises(InvalidModelName) as ei:
        parse_name(bad)
    assert "\n" not in str(ei.value) and "\x00" not in str(ei.value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab./:\\-_@\x00~ ")), max_size=30))
def test_no_name_escapes_store(text):
    root = Path("/tmp/store-root")
    try:
        n = parse_name(text)
    except InvalidModelName:
        return
    p = Store(root).manifest_path(n).resolve()
    assert p.is_relative_to(root / "manifests") and len(p.relative_to(root / "manifests").parts) == 4


def test_looks_like_path(tmp_path, monkeypatch):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    assert looks_like_path(str(f)) and looks_like_path("./m.gguf") and looks_like_path("m.gguf")
    assert not looks_like_path("smollm2:135m") and not looks_like_path("hf.co/o/r:file.gguf")
    # a name too long for a file here is no OSError: bare, it reads as a path; in a folder, as no file there
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert looks_like_path("a" * 300 + ".gguf") and not looks_like_path("sub/" + "a" * 300 + ".gguf")


@pytest.mark.parametrize(("text", "what", "length", "limit"), [
    ("a" * 300, "model", 300, 80),
    ("a" * 81, "model", 81, 80),
    ("ns" * 41 + "/m", "namespace", 82, 80),
    ("m:" + "t" * 129, "tag", 129, 128),
    ("h" * 254 + "/n/m", "host", 254, 253),
    ("x" * 351, "name", 351, 350),  # the whole text
])
def test_too_long_names_say_so(text, what, length, limit):
    with pytest.raises(InvalidModelName) as ei:
        parse_name(text)
    msg = str(ei.value)
    assert f": {what} is too long ({length} characters, the limit is {limit})" in msg, msg
    assert "\n" not in msg and "bad " not in msg
    shown = msg.split("'")[1]  # the quoted name: cut, and the cut marked with '…'
    assert shown.endswith("…") and text.startswith(shown[:-1]) and len(shown) < len(text)


def test_names_at_the_limit_pass_and_short_names_are_shown_whole():
    assert parse_name("a" * 80 + ":" + "t" * 128).model == "a" * 80
    with pytest.raises(InvalidModelName) as ei:
        parse_name("bad!name")
    assert "'bad!name'" in str(ei.value) and "…" not in str(ei.value) and "bad model 'bad!name'" in str(ei.value)
    with pytest.raises(InvalidModelName) as ei:  # a long name with a bad character: the bad part is cut with '…' too
        parse_name("ns/" + "b" * 70 + "!")
    bad_part = str(ei.value).split("bad model ")[1].split("'")[1]
    assert bad_part.endswith("…") and bad_part[:-1] == ("b" * 70)[:len(bad_part) - 1]
