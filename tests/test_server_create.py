"""``/api/create`` builds the model from its JSON fields (no Modelfile text round trip), takes a vision model's
projector as Ollama's client sends it, and ``/api/blobs`` leaves no temp file behind on any exit path.

The fuzzed properties of every create field are in tests/test_server_fuzz.py; these are the instances the review
found (issue 53, findings 1, 9 and 10), on the server app without a model loaded.
"""
from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tiny_gguf import tiny_gguf

from ollapy import config
from ollapy.server.app import create_app
from tests.test_vision_engine import _script

pytestmark = pytest.mark.usefixtures("bare_app_env")


@pytest.fixture
def client():
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _create(c: TestClient, body: dict):
    return c.post("/api/create", json={"model": "mine", "stream": False, **body})


def _upload(c: TestClient, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert c.post(f"/api/blobs/{digest}", content=data).status_code == 201
    return digest


@pytest.fixture
def projector(tmp_path) -> bytes:
    return _script().write_projector(tmp_path / "mmproj.gguf", "gemma3", 0, 576).read_bytes()


# ---- finding 1: a field's value never becomes a Modelfile line --------------------------------------
@pytest.mark.parametrize("keyword", ["FROM", "DRAFT", "ADAPTER", "PARAMETER num_ctx"])
def test_a_message_role_cannot_inject_modelfile_lines(client, keyword):
    """A role of ``user\\nFROM /etc/passwd\\nSYSTEM`` was written into Modelfile text and parsed again: /etc/passwd
    became the projector (or the draft model), and the answer told an existing file ("not a vision projector", "not
    a readable GGUF file") from a missing one ("no such file")."""
    _upload(client, tiny_gguf())
    answers = []
    for path in ("/etc/passwd", "/etc/no-such-file-here"):
        r = _create(client, {"files": {"m.gguf": "sha256:" + hashlib.sha256(tiny_gguf()).hexdigest()},
                             "messages": [{"role": f"user\n{keyword} {path}\nSYSTEM", "content": "hi"}]})
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1] == (400, {"error": "messages.0.role must be one of system, user, assistant, tool"})
    assert not (config.models_dir() / "manifests").exists()


def test_field_values_are_kept_as_data(client):
    """Newlines, quotes and Modelfile keywords in system, template, license and message contents are stored as
    sent, not read as instructions."""
    from ollapy.store import resolve_model

    digest = _upload(client, tiny_gguf())
    odd = 'a\nFROM /etc/passwd\nDRAFT /etc/passwd\n"""\nPARAMETER num_ctx 1\n"\x00'
    r = _create(client, {"files": {"m.gguf": digest}, "system": odd, "license": [odd, "MIT"],
                         "messages": [{"role": "assistant", "content": odd}], "parameters": {"stop": [odd]}})
    assert r.status_code == 200, r.text
    ref = resolve_model("mine", pull=False)
    assert (ref.system, ref.messages, ref.parameters) == (odd, [{"role": "assistant", "content": odd}],
                                                          {"stop": [odd]})
    assert ref.license == f"{odd}\nMIT" and ref.projector is None


# ---- finding 10: a vision model's GGUF and projector in files, or a second FROM ---------------------
def test_files_with_a_model_and_its_projector_make_a_vision_model(client, projector):
    """What Ollama's client sends for a vision model (``files`` = model + mmproj): the GGUF header tells which is
    the projector (general.architecture ``clip``), whatever the names or order."""
    from ollapy.store import resolve_model

    model, proj = _upload(client, tiny_gguf()), _upload(client, projector)
    r = _create(client, {"files": {"a.gguf": proj, "b.gguf": model}, "system": "look"})
    assert r.status_code == 200, r.text
    ref = resolve_model("mine", pull=False)
    assert ref.projector is not None and ref.projector.read_bytes() == projector
    assert ref.path.read_bytes() == tiny_gguf() and ref.system == "look"
    shown = client.post("/api/show", json={"model": "mine"}).json()
    assert "vision" in shown["capabilities"] and shown["projector_info"]["general.architecture"] == "clip"
    for files, words in (({"a.gguf": proj}, "a vision projector (mmproj) but no model"),
                         ({"a.gguf": proj, "b.gguf": proj.replace("sha256:", "sha256-")}, "two vision projectors")):
        r = _create(client, {"model": "other", "files": files})
        assert r.status_code == 400 and words in r.json()["error"], r.text


def test_a_legacy_modelfile_second_from_keeps_the_projector(client, projector):
    """A second FROM naming the uploaded projector makes a vision model (it was silently dropped); a second FROM
    naming a server path is refused with the same words whether or not the file exists."""
    from ollapy.store import resolve_model

    model, proj = _upload(client, tiny_gguf()), _upload(client, projector)
    r = _create(client, {"modelfile": f"FROM @{model}\nFROM @{proj}\nSYSTEM hi\n"})
    assert r.status_code == 200, r.text
    ref = resolve_model("mine", pull=False)
    assert ref.projector is not None and ref.projector.read_bytes() == projector and ref.system == "hi"
    answers = [_create(client, {"model": "x", "modelfile": f"FROM @{model}\nFROM {p}\n"}) for p in
               ("/etc/passwd", "/etc/no-such-file-here", "./mmproj.gguf", "smol")]
    assert {a.status_code for a in answers} == {400} and len({a.content for a in answers}) == 1, answers[0].text
    assert "projector is an uploaded blob" in answers[0].json()["error"]


# ---- finding 9: an upload's temp file goes on every exit path -------------------------------------
def _temp_files() -> list[Path]:
    blobs = config.models_dir() / "blobs"
    return sorted(p for p in blobs.glob(".upload-*")) if blobs.exists() else []


def test_a_digest_mismatch_leaves_no_temp_file(client):
    r = client.post("/api/blobs/sha256:" + "0" * 64, content=b"not these bytes")
    assert r.status_code == 400 and "digest mismatch" in r.json()["error"]
    assert _temp_files() == []


def _start_upload(url: str, total: int, sent: int) -> socket.socket:
    """A raw connection that sent the headers of a ``total``-byte blob upload and ``sent`` bytes of its body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST /api/blobs/sha256:{'0' * 64} HTTP/1.1\r\nHost: {host}:{port}\r\n"
              f"Content-Length: {total}\r\nContent-Type: application/octet-stream\r\n\r\n".encode())
    for _ in range(sent >> 20):
        s.sendall(bytes(1 << 20))
    return s


def _wait(cond, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_an_upload_leaves_no_temp_file_on_any_exit_path(tmp_path):
    """A real server (uvicorn) and a 64 MiB upload cut half-way: by the client closing the connection, and by the
    server shutting down mid-upload (uvicorn cancels the request after its graceful wait: the CancelledError path,
    which left the partial file); a partial file an earlier, killed server left is swept when the server starts."""
    from tests.conftest import live_server

    blobs = tmp_path / "models" / "blobs"
    blobs.mkdir(parents=True)
    stale = blobs / ".upload-killed"
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = blobs / ".upload-another-server"  # another process's upload in flight: not touched
    fresh.write_bytes(b"partial")

    def partials() -> list[Path]:
        return sorted(p for p in blobs.glob(".upload-*") if p != fresh)

    with live_server(tmp_path) as url:
        assert _wait(lambda: not stale.exists()) and fresh.exists()
        with _start_upload(url, 64 << 20, 32 << 20):
            assert _wait(lambda: bool(partials())), "the upload never started"
        assert _wait(lambda: not partials()), partials()  # the client went away
        conn = _start_upload(url, 64 << 20, 32 << 20)
        assert _wait(lambda: bool(partials())), "the upload never started"
    conn.close()  # the server has shut down (SIGTERM) while the upload was still open
    assert partials() == [] and fresh.exists()
