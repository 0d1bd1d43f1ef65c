"""The exception→status table: only validation errors are 400s; an unexpected exception is a 500 with a logged
traceback and a one-line body in the caller's error shape (a bug is never disguised as a bad request)."""
from __future__ import annotations

import json
import logging

import pydantic
import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from ollapy.errors import ModelNotFound, UsageError
from ollapy.server.app import create_app
from ollapy.server.errors import status_for


class _Body(pydantic.BaseModel):
    n: int


def _validation_error() -> pydantic.ValidationError:
    try:
        _Body(n="x")
    except pydantic.ValidationError as e:
        return e
    raise AssertionError("no error")


@pytest.mark.parametrize("exc, status", [
    (UsageError("bad"), 400), (ModelNotFound("m"), 404), (_validation_error(), 400),
    (json.JSONDecodeError("x", "doc", 0), 400), (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), 400),
    (TypeError("'NoneType' object is not subscriptable"), 500), (KeyError("slot"), 500),
    (ValueError("too many values to unpack"), 500), (AttributeError("x"), 500), (FileNotFoundError(2, "x"), 500),
    (RuntimeError("x"), 500),
])
def test_status_for(exc, status):
    assert status_for(exc) == status


@pytest.fixture
def buggy(tmp_path, monkeypatch):
    """The app with routes that fail the way internal bugs do, in each API's namespace."""
    monkeypatch.setenv("OLLAPY_MODELS", str(tmp_path / "models"))
    app = create_app(bind="127.0.0.1")
    router = APIRouter()

    def bug(kind: str):
        if kind == "type":
            missing = None
            return missing["x"]
        if kind == "key":
            return {}["slot"]
        if kind == "value":
            return int("seven")
        if kind == "usage":
            raise UsageError("num_ctx must be >= 16", hint="raise it")
        return None

    for path in ("/api/_bug/{kind}", "/v1/_bug/{kind}", "/v1/messages/_bug/{kind}"):
        router.add_api_route(path, bug, methods=["GET"])
    app.include_router(router)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


@pytest.mark.parametrize("kind", ["type", "key", "value"])
def test_internal_bug_is_500_with_traceback_logged(buggy, kind, caplog):
    with caplog.at_level(logging.ERROR, logger="ollapy.server"):
        r = buggy.get(f"/api/_bug/{kind}")
    assert r.status_code == 500, r.text
    msg = r.json()["error"]
    assert "\n" not in msg and "internal error" in msg
    assert any(rec.exc_info for rec in caplog.records), "no traceback logged"
    assert buggy.get(f"/v1/_bug/{kind}").json()["error"]["type"] == "api_error"
    body = buggy.get(f"/v1/messages/_bug/{kind}").json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"


def test_usage_error_is_still_400(buggy):
    r = buggy.get("/api/_bug/usage")
    assert r.status_code == 400 and r.json()["error"] == "num_ctx must be >= 16 (raise it)"


def test_request_validation_is_400(buggy):
    r = buggy.get("/api/ps", params={"x": 1})
    assert r.status_code in (200, 400)
    r = buggy.post("/api/chat", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]


def test_a_chosen_503_is_a_warning_and_a_bug_an_error_with_its_traceback(caplog):
    from ollapy.server.errors import log_error
    from ollapy.server.scheduler import busy

    full = busy("no room to load m: 1 models are loaded and busy", hint="retry shortly")
    with caplog.at_level(logging.DEBUG, logger="ollapy.server"):
        log_error(full, status_for(full))
        log_error(RuntimeError("boom"), 500)
    (chosen, bug) = caplog.records
    assert status_for(full) == 503
    assert chosen.levelno == logging.WARNING and not chosen.exc_info
    assert bug.levelno == logging.ERROR and bug.exc_info
