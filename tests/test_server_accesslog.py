"""``ollapy serve`` logs one line per request (as Ollama's gin logger): status, duration, client, method, path.

The app runs under FastAPI's TestClient without its lifespan: nothing is loaded.
"""
from __future__ import annotations

import logging
import re

import pytest
from fastapi.testclient import TestClient

from ollapy.server.app import create_app

LINE = re.compile(r"^(\d{3}|-) \| +(\d+\.\d{3})s \| (\S+) \| ([A-Z]+) (\S*)$")


pytestmark = pytest.mark.usefixtures("bare_app_env")


def _lines(caplog) -> list[tuple[str, ...]]:
    out = []
    for rec in caplog.records:
        if rec.name == "ollapy.access":
            m = LINE.match(rec.getMessage())
            assert m, rec.getMessage()
            out.append(m.groups())
    return out


def test_each_request_is_one_line_with_its_status_and_no_query(caplog):
    caplog.set_level(logging.INFO, logger="ollapy.access")
    c = TestClient(create_app(bind="127.0.0.1"), base_url="http://127.0.0.1")
    assert c.get("/api/version?key=secret").status_code == 200
    assert c.post("/api/show", json={"model": "no-such-model"}).status_code == 404
    assert c.post("/api/chat", content=b"{not json").status_code == 400
    rows = _lines(caplog)
    assert [(r[0], r[3], r[4]) for r in rows] == [("200", "GET", "/api/version"), ("404", "POST", "/api/show"),
                                                  ("400", "POST", "/api/chat")], rows
    assert all(r[2] == "testclient" for r in rows)
    assert "secret" not in caplog.text


def test_a_refused_host_is_logged_too(caplog):
    caplog.set_level(logging.INFO, logger="ollapy.access")
    c = TestClient(create_app(bind="127.0.0.1"), base_url="http://evil.example")
    assert c.get("/api/tags").status_code == 403
    assert [(r[0], r[4]) for r in _lines(caplog)] == [("403", "/api/tags")]
