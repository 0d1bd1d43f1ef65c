"""A server opens no file a client names, for a draft model too: ``DRAFT`` lines and ``parameters.draft`` in
/api/create, a request's ``options.draft`` and a relative model path are refused with the same words whether the
file exists or not (no existence oracle), unless ``serve --allow-paths`` and the path is absolute.

The app runs under FastAPI's TestClient without its lifespan: nothing is loaded.
"""
from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient
from tiny_gguf import tiny_gguf

from ollapy.server.app import create_app


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    d = tmp_path / "secret"
    d.mkdir()
    real = d / "draft.gguf"
    real.write_bytes(tiny_gguf(pad=60))
    (d / "notes.txt").write_text("not a model")
    monkeypatch.chdir(d)
    return real, d / "missing.gguf", d / "notes.txt"


def _client(allow_paths: bool = False) -> TestClient:
    return TestClient(create_app(allow_paths=allow_paths), base_url="http://127.0.0.1")


def _blob(c: TestClient) -> str:
    data = tiny_gguf(pad=60)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert c.post(f"/api/blobs/{digest}", content=data).status_code == 201
    return digest


def _same_refusal(a, b) -> str:
    assert a.status_code == b.status_code == 400, (a.text, b.text)
    assert a.content == b.content
    assert "path" in a.json()["error"]
    return a.text


def _variants(real, missing, notes):
    return [(str(real), str(missing)), (str(notes), str(missing)), ("draft.gguf", "missing.gguf"),
            ("./draft.gguf", "./missing.gguf"), ("../secret/draft.gguf", "../secret/missing.gguf"),
            ("/etc/passwd", "/etc/no-such-file")]


def test_create_draft_line_same_answer_exists_or_not(env):
    c = _client()
    digest = _blob(c)
    for a, b in _variants(*env):
        def create(draft):
            return c.post("/api/create", json={"model": "m", "stream": False,
                                               "modelfile": f"FROM @{digest}\nDRAFT {draft}\n"})
        text = _same_refusal(create(a), create(b))
        assert str(env[0].parent) not in text


def test_create_parameters_draft_same_answer_exists_or_not(env):
    c = _client()
    digest = _blob(c)
    for a, b in _variants(*env):
        def create(draft):
            return c.post("/api/create", json={"model": "m", "stream": False, "from": digest,
                                               "parameters": {"draft": draft}})
        _same_refusal(create(a), create(b))


def test_create_with_allow_paths_still_refuses_relative_drafts(env):
    c = _client(allow_paths=True)
    digest = _blob(c)
    for a, b in (("draft.gguf", "missing.gguf"), ("./draft.gguf", "./missing.gguf")):
        def create(draft):
            return c.post("/api/create", json={"model": "m", "stream": False, "from": digest,
                                               "parameters": {"draft": draft}})
        _same_refusal(create(a), create(b))


def test_request_draft_option_same_answer_exists_or_not(env):
    c = _client()
    digest = _blob(c)
    assert c.post("/api/create", json={"model": "m", "stream": False, "from": digest}).status_code == 200
    for a, b in _variants(*env):
        def ask(draft):
            return c.post("/api/generate", json={"model": "m", "prompt": "hi", "stream": False,
                                                 "options": {"draft": draft}})
        _same_refusal(ask(a), ask(b))


def test_allow_paths_server_refuses_relative_model_and_draft_paths(env):
    c = _client(allow_paths=True)
    for a, b in (("draft.gguf", "missing.gguf"), ("./draft.gguf", "./missing.gguf"),
                 ("../secret/draft.gguf", "../secret/missing.gguf")):
        ra, rb = c.post("/api/show", json={"model": a}), c.post("/api/show", json={"model": b})
        assert ra.status_code == rb.status_code == 400, (ra.text, rb.text)
        assert ra.text.replace("draft", "X") == rb.text.replace("missing", "X")  # words echo the name, no more
