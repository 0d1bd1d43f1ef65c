"""What Ollama and OpenAI clients really expect, without a live server (issue 12).

``serve`` on a taken port fails with one line (real CLI, subprocess); ``list``
and ``/api/tags`` sort newest first with one model ID; an unset
``num_predict`` stops at the model's ``n_ctx_train`` (engine on the fake
backend, through context shifts). The live-server parts (``context``,
404/405 shapes, the ID in ``ps``) are in tests/test_server_api.py.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from conftest import run_cli
from fake_backend import FakeBackend

from ollapy.engine.engine import Engine
from ollapy.options import Options, predict_limit


# ---- serve on a port already in use ------------------------------------------------------------------------
def test_serve_on_a_taken_port_is_one_error_line_and_exit_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli("serve", env={"OLLAPY_HOST": f"127.0.0.1:{port}"}, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert err.splitlines() == [err.strip()]  # ONE line, no traceback, no uvicorn log
    assert err.startswith(f"Error: cannot listen on 127.0.0.1:{port}: address already in use")
    assert "--host" in err and "listening on" not in err and r.stdout == b""


# ---- one ID, newest first ----------------------------------------------------------------------------------
def _three_models(smollm2_path: Path) -> dict[str, float]:
    """smol-a, smol-b, smol-c in the test's store with modified times making the order b, c, a."""
    from ollapy.store import copy_model, create_model, list_models

    create_model("smol-a", f"FROM {smollm2_path}\n", smollm2_path.parent, quiet=True)
    copy_model("smol-a", "smol-b")
    copy_model("smol-a", "smol-c")
    times = {"smol-b:latest": 3_000_000, "smol-c:latest": 2_000_000, "smol-a:latest": 1_000_000}
    for m in list_models():
        os.utime(m.entry.path, (times[m.name], times[m.name]))
    return times


def test_list_and_tags_sort_newest_first_with_the_same_id(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))  # only this test's store is listed
    from fastapi.testclient import TestClient

    from ollapy.server.app import create_app
    from ollapy.store import list_models

    _three_models(smollm2_path)
    models = list_models()
    assert [m.name for m in models] == ["smol-b:latest", "smol-c:latest", "smol-a:latest"]
    assert len({m.digest for m in models}) == 1 and len(models[0].digest) == 64  # a cp keeps the ID
    assert all(m.id == m.digest[:12] for m in models)

    rows = run_cli("list").stdout.decode().splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["smol-b:latest", "smol-c:latest", "smol-a:latest"]
    assert {r.split()[1] for r in rows} == {models[0].id}

    tags = TestClient(create_app(), base_url="http://127.0.0.1").get("/api/tags").json()["models"]  # no lifespan: none loaded
    assert [t["name"] for t in tags] == ["smol-b:latest", "smol-c:latest", "smol-a:latest"]
    assert {t["digest"] for t in tags} == {models[0].digest}


def test_unknown_routes_and_methods_answer_in_the_callers_format():
    from fastapi.testclient import TestClient

    from ollapy.server.app import create_app

    c = TestClient(create_app(), base_url="http://127.0.0.1")
    for method, path, status in (("GET", "/api/nosuch", 404), ("GET", "/api/generate", 405),
                                 ("DELETE", "/api/tags", 405), ("POST", "/nosuch", 404)):
        r = c.request(method, path)
        body = r.json()
        assert r.status_code == status and set(body) == {"error"} and isinstance(body["error"], str), (path, body)
        assert path in body["error"] or not path.startswith("/api/")  # other paths are redacted as <path>
    assert "POST" in c.get("/api/generate").headers["allow"]  # a 405 still says which methods the route takes
    for method, path, status in (("GET", "/v1/nosuch", 404), ("GET", "/v1/chat/completions", 405),
                                 ("POST", "/v1/models", 405)):
        r = c.request(method, path)
        e = r.json()["error"]
        assert r.status_code == status, (path, r.text)
        assert set(e) == {"message", "type", "param", "code"} and e["type"] == "invalid_request_error", e
        assert e["param"] is None and path in e["message"]
    r = c.get("/v1/models/nosuch")
    e = r.json()["error"]
    assert r.status_code == 404 and e["type"] == "invalid_request_error" and e["code"] == "model_not_found"


# ---- num_predict unset: at most n_ctx_train generated tokens ----------------------------------------------
def test_predict_limit_caps_only_an_unset_num_predict():
    assert predict_limit(-1, 8192) == 8192
    assert predict_limit(-2, 8192) == 8192
    assert predict_limit(0, 8192) == 0 and predict_limit(50000, 8192) == 50000  # an explicit value is kept
    assert predict_limit(-1, 0) == -1  # unknown training context: no cap


def test_unset_num_predict_stops_at_n_ctx_train_across_context_shifts():
    # the fake model never emits its end token: without the cap this runs MAX_SHIFTS shifts (about 2000 tokens)
    b = FakeBackend(n_parallel=1, num_ctx=64)
    b.n_ctx_train = 150
    e = Engine(b)
    try:
        text, last = e.submit(list(range(1, 11)), Options(temperature=0, repeat_penalty=1.0)).result()
        assert last.done_reason == "length"
        assert last.metrics.eval_count == 150 and len(text.split()) == 150
        assert last.metrics.shifts >= 2  # the cap holds across context shifts
        _, last = e.submit(list(range(1, 11)), Options(temperature=0, repeat_penalty=1.0, num_predict=200)).result()
        assert last.metrics.eval_count == 200  # an explicit num_predict is not capped
    finally:
        e.close()
