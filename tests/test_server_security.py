"""Server security: CORS origins as Ollama's, /api/create without server paths, path-free API errors.

The app runs under FastAPI's TestClient without its lifespan: nothing is
loaded (every request here is refused or handled before a model would be).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tiny_gguf import tiny_gguf

from ollapy import config
from ollapy.server.app import create_app


@pytest.fixture
def client(tmp_path, monkeypatch) -> TestClient:
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.delenv("OLLAPY_ORIGINS", raising=False)
    return TestClient(create_app(), base_url="http://127.0.0.1")


def _preflight(c: TestClient, origin: str):
    return c.options("/api/tags", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})


# ---- CORS ---------------------------------------------------------------------------------------
OLLAMA_DEFAULT_ORIGINS = [
    "http://localhost", "https://localhost", "http://localhost:3000", "https://localhost:8443",
    "http://127.0.0.1", "https://127.0.0.1:5173", "http://0.0.0.0", "https://0.0.0.0:80",
    "app://obsidian.md", "file://", "tauri://localhost", "vscode-webview://1234abcd", "vscode-file://vscode-app",
]
FOREIGN_ORIGINS = ["https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.evil.example",
                   "http://192.168.1.10:3000", "chrome-extension://abcdef", "null"]


@pytest.mark.parametrize("origin", OLLAMA_DEFAULT_ORIGINS)
def test_cors_default_origins_are_ollamas(client, origin):
    r = _preflight(client, origin)
    assert r.status_code == 200
    assert r.headers.get("access-control-allow-origin") == origin


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_cors_foreign_origin_gets_no_allow_header(client, origin):
    r = _preflight(client, origin)
    assert "access-control-allow-origin" not in r.headers
    simple = client.get("/api/version", headers={"Origin": origin})
    assert "access-control-allow-origin" not in simple.headers


def test_cors_ollapy_origins_extends_the_list(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAPY_ORIGINS", "https://evil.example, chrome-extension://*")
    c = TestClient(create_app(), base_url="http://127.0.0.1")
    for origin in ("https://evil.example", "chrome-extension://abcdef", "http://localhost:3000"):
        assert _preflight(c, origin).headers.get("access-control-allow-origin") == origin
    assert "access-control-allow-origin" not in _preflight(c, "https://other.example").headers


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_a_foreign_page_cannot_run_a_simple_request(client, origin):
    """A cross-site "simple" request (text/plain, no preflight) is refused before it runs, as Ollama's CORS
    middleware aborts with 403: CORS alone would only hide the answer after the model was created."""
    body = json.dumps({"model": "victim", "from": "smollm2:135m", "system": "visit evil.example", "stream": False})
    r = client.post("/api/create", content=body, headers={"Origin": origin, "Content-Type": "text/plain"})
    assert r.status_code == 403, r.text
    assert origin in r.json()["error"] and "OLLAPY_ORIGINS" in r.json()["error"]
    assert not (config.models_dir() / "manifests").exists()  # nothing was created
    for path in ("/api/copy", "/api/pull", "/api/delete", "/api/chat"):
        assert client.post(path, content="{}", headers={"Origin": origin}).status_code == 403, path


def test_a_refused_origin_answers_in_each_apis_format(client):
    h = {"Origin": "https://evil.example"}
    openai = client.post("/v1/chat/completions", json={}, headers=h)
    assert openai.status_code == 403 and openai.json()["error"]["code"] == "origin_not_allowed"
    anthropic = client.post("/v1/messages", json={}, headers=h)
    assert anthropic.status_code == 403 and anthropic.json()["error"]["type"] == "permission_error"
    assert client.get("/api/tags", headers=h).status_code == 403


def test_same_origin_and_allowed_origins_pass(tmp_path, monkeypatch):
    """The chat page's own requests are same-origin (its Origin is the server's own address, whatever name it is
    reached by); a request without Origin (curl, SDKs) and an OLLAPY_ORIGINS page pass too."""
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAPY_ORIGINS", "https://app.example")
    c = TestClient(create_app(), base_url="http://box.local:11435")
    assert c.get("/api/tags", headers={"Origin": "http://box.local:11435"}).status_code == 200
    assert c.get("/api/tags", headers={"Origin": "http://other.local:11435"}).status_code == 403
    assert c.get("/api/tags").status_code == 200
    r = c.get("/api/tags", headers={"Origin": "https://app.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"


# ---- /api/create: a file that is not a model GGUF -----------------------------------------------
@pytest.mark.parametrize("data, why", [
    (bytes(range(256)) * 400, "no GGUF magic"),
    (tiny_gguf(pad=0)[:30], "truncated"),
    (tiny_gguf(arch="clip"), "vision projector"),
])
def test_create_refuses_a_file_that_is_not_a_model(client, data, why):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert client.post(f"/api/blobs/{digest}", content=data).status_code == 201
    r = _create(client, {"files": {"model.gguf": digest}})
    assert r.status_code == 400 and why in r.json()["error"], r.text
    assert not (config.models_dir() / "manifests").exists()


def test_cli_create_refuses_random_bytes(tmp_path, monkeypatch):
    from ollapy.errors import ModelLoadError
    from ollapy.store import create_model

    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    (tmp_path / "junk.gguf").write_bytes(bytes(range(256)) * 400)
    with pytest.raises(ModelLoadError, match="FROM junk.gguf: not a GGUF model file .no GGUF magic."):
        create_model("junk", "FROM junk.gguf\n", tmp_path)
    (tmp_path / "ok.gguf").write_bytes(tiny_gguf())
    assert create_model("fine", "FROM ok.gguf\n", tmp_path).name.startswith("fine")


# ---- /api/create: uploaded blobs and store names only -------------------------------------------
def _create(c: TestClient, body: dict):
    return c.post("/api/create", json={"model": "mine", "stream": False, **body})


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    """An existing GGUF-looking file and a path that does not exist, side by side."""
    d = tmp_path / "secret"
    d.mkdir()
    real = d / "weights.gguf"
    real.write_bytes(tiny_gguf(pad=60))
    return real, d / "missing.gguf"


def _same_400(a, b) -> str:
    assert a.status_code == b.status_code == 400, (a.text, b.text)
    assert a.content == b.content
    return a.text


def test_create_from_absolute_path_same_answer_exists_or_not(client, files):
    real, missing = files
    text = _same_400(_create(client, {"from": str(real)}), _create(client, {"from": str(missing)}))
    assert "not a file path on the server" in json.loads(text)["error"]
    assert str(real.parent) not in text
    assert not (config.models_dir() / "manifests").exists()  # nothing was created


def test_create_from_system_file_same_answer(client):
    _same_400(_create(client, {"from": "/etc/passwd"}), _create(client, {"from": "/etc/no-such-file-here"}))


def test_create_from_relative_path_same_answer(client, files, monkeypatch):
    real, missing = files
    monkeypatch.chdir(real.parent.parent / "secret")  # the server's cwd holds weights.gguf
    _same_400(_create(client, {"from": "weights.gguf"}), _create(client, {"from": "missing.gguf"}))
    _same_400(_create(client, {"from": "./weights.gguf"}), _create(client, {"from": "./missing.gguf"}))
    _same_400(_create(client, {"from": "../secret/weights.gguf"}), _create(client, {"from": "../secret/missing.gguf"}))
    _same_400(_create(client, {"from": "~/weights.gguf"}), _create(client, {"from": "~/missing.gguf"}))


def test_create_modelfile_from_path_same_answer(client, files, monkeypatch):
    real, missing = files
    monkeypatch.chdir(real.parent)
    for a, b in ((str(real), str(missing)), ("weights.gguf", "missing.gguf"), ("/etc/passwd", "/etc/nope")):
        _same_400(_create(client, {"modelfile": f"FROM {a}\nPARAMETER temperature 0\n"}),
                  _create(client, {"modelfile": f"FROM {b}\nPARAMETER temperature 0\n"}))


def test_create_from_uploaded_blob_works(client, files):
    from ollapy.store import resolve_model

    data = files[0].read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert client.head(f"/api/blobs/{digest}").status_code == 404
    assert client.post(f"/api/blobs/{digest}", content=data).status_code == 201
    assert client.head(f"/api/blobs/{digest}").status_code == 200
    r = _create(client, {"files": {"weights.gguf": digest}, "parameters": {"temperature": 0}})
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "success"}
    ref = resolve_model("mine", pull=False)
    assert ref.path.read_bytes() == data and ref.parameters == {"temperature": 0}
    # the same blob named by digest in `from` and in a Modelfile's FROM
    assert _create(client, {"model": "mine2", "from": digest}).status_code == 200
    assert _create(client, {"model": "mine3", "modelfile": f"FROM @{digest}\nSYSTEM hi\n"}).status_code == 200
    assert resolve_model("mine3", pull=False).system == "hi"
    # a store name as FROM (an existing model) works too
    assert _create(client, {"model": "mine4", "from": "mine", "system": "be brief"}).status_code == 200
    assert resolve_model("mine4", pull=False).system == "be brief"


def test_create_blob_not_uploaded_is_400_without_paths(client):
    r = _create(client, {"files": {"m.gguf": "sha256:" + "0" * 64}})
    assert r.status_code == 400
    assert "was not uploaded" in r.json()["error"]
    assert str(config.models_dir()) not in r.text and "/blobs/sha256-" not in r.text


def test_create_allow_paths_takes_absolute_paths_only(tmp_path, monkeypatch, files):
    from ollapy.store import resolve_model

    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    c = TestClient(create_app(allow_paths=True), base_url="http://127.0.0.1")
    real, _ = files
    r = _create(c, {"from": str(real)})
    assert r.status_code == 200, r.text
    assert resolve_model("mine", pull=False).path.read_bytes() == real.read_bytes()
    monkeypatch.chdir(real.parent)
    _same_400(_create(c, {"from": "weights.gguf"}), _create(c, {"from": "missing.gguf"}))


# ---- /api/generate, /api/chat, /api/show: a model given as a server path -------------------------
@pytest.mark.parametrize("route,extra", [("/api/generate", {"prompt": "hi"}),
                                         ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                                         ("/api/show", {})])
def test_model_path_same_answer_exists_or_not(client, files, monkeypatch, route, extra):
    real, missing = files
    monkeypatch.chdir(real.parent)

    def ask(model):
        return client.post(route, json={"model": model, "stream": False, **extra})

    for a, b in ((str(real), str(missing)), ("./weights.gguf", "./missing.gguf"), ("weights.gguf", "missing.gguf")):
        text = _same_400(ask(a), ask(b))
        assert str(real.parent) not in text


# ---- API errors carry no server paths and no catalogue listing ----------------------------------
def test_errors_name_no_server_paths(client):
    from ollapy.store import catalogue

    store = str(config.models_dir())
    cat = str(catalogue.catalogue_dir())
    aliases = catalogue.default_aliases()
    answers = [
        client.post("/api/show", json={"model": "nosuch"}),
        client.request("DELETE", "/api/delete", json={"model": "nosuch"}),
        client.post("/api/copy", json={"source": "nosuch", "destination": "other"}),
        client.post("/api/generate", json={"model": "nosuch", "prompt": "hi", "stream": False}),
        client.post("/v1/chat/completions", json={"model": "nosuch", "messages": [{"role": "user", "content": "x"}]}),
    ]
    for r in answers:
        assert r.status_code in (400, 404), r.text
        assert store not in r.text and cat not in r.text, r.text
        assert not any(a in r.text for a in aliases), r.text
        assert "nosuch" in r.text
    assert json.loads(answers[0].text)["error"].startswith("model 'nosuch:latest' not found")


def test_redact_paths_keeps_api_routes_and_urls():
    from ollapy.server.errors import redact_paths

    assert redact_paths("model 'x' not found in /home/u/.local/share/ollapy/models (run `ollapy list`)") == \
        "model 'x' not found in <path> (run `ollapy list`)"
    assert redact_paths("'/srv/m.gguf': no such file") == "'<path>': no such file"
    assert redact_paths("/srv/m.gguf: not a readable GGUF file") == "<path>: not a readable GGUF file"
    kept = "POST it to /api/blobs/<digest> first; see https://registry.ollama.ai/v2/library and hf.co/org/repo"
    assert redact_paths(kept) == kept


def test_public_words_are_what_clients_see():
    from ollapy.errors import ModelLoadError, ModelNotFound
    from ollapy.server.errors import message_for

    exc = ModelNotFound("model 'x' not found: not in the store /srv/store", hint="aliases: a, b",
                        public="model 'x' not found", name="x")
    assert message_for(exc) == "model 'x' not found (try `ollapy pull x`)"  # the model asked for, not a placeholder
    assert message_for(ModelNotFound("model 'y' not found")) == "model 'y' not found (try `ollapy pull NAME`)"
    assert message_for(ModelLoadError("/srv/m.gguf: not a readable GGUF file", hint="re-pull the model")) == \
        "<path>: not a readable GGUF file (re-pull the model)"


def test_unknown_url_is_shown_as_sent(client):
    """The path of a request's own URL is not a server path: a 404 names it as sent."""
    assert client.get("/foo/bar").json()["error"].startswith("no such endpoint: GET /foo/bar")
