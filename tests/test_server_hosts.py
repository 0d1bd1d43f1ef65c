"""DNS rebinding: a loopback server answers only local ``Host`` names (Ollama's allowedHostsMiddleware rules).

The app runs under FastAPI's TestClient without its lifespan: nothing is loaded, and a refused request never
reaches a route.
"""
from __future__ import annotations

import re
import socket

import pytest
from fastapi.testclient import TestClient

from ollapy.server.app import create_app
from ollapy.server.hosts import host_allowed

pytestmark = pytest.mark.usefixtures("bare_app_env")


def _every_route(app) -> list[tuple[str, str]]:
    """(method, concrete path) for every route of the app, path parameters filled with a dummy value."""
    out = []

    def walk(routes, prefix: str) -> None:
        for route in routes:
            inner = getattr(route, "original_router", None)  # FastAPI's included router
            if inner is not None:
                walk(inner.routes, prefix + route.include_context.prefix)
                continue
            path = re.sub(r"\{[^}]+\}", "x", prefix + route.path)
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                out.append((method, path))

    walk(app.routes, "")
    assert len(out) > 20 and ("POST", "/api/create") in out and ("DELETE", "/api/delete") in out
    return out


@pytest.mark.parametrize("host", ["evil.example", "evil.example:11435", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "8.8.8.8"])
def test_rebinding_host_gets_403_on_every_route(host):
    app = create_app(bind="127.0.0.1")
    c = TestClient(app, base_url=f"http://{host}")
    for method, path in _every_route(app) + [("OPTIONS", "/api/tags"), ("GET", "/no/such/route")]:
        r = c.request(method, path, json={"model": "x"} if method == "POST" else None)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert method == "HEAD" or ("not allowed" in r.text and "OLLAPY_ALLOWED_HOSTS" in r.text)


def test_403_in_each_apis_error_shape():
    c = TestClient(create_app(bind="127.0.0.1"), base_url="http://evil.example")
    assert isinstance(c.get("/api/tags").json()["error"], str)
    assert c.get("/v1/models").json()["error"]["code"] == "host_not_allowed"
    body = c.post("/v1/messages", json={}).json()
    assert body["type"] == "error" and body["error"]["type"] == "permission_error"


@pytest.mark.parametrize("host", ["127.0.0.1:11435", "localhost", "LOCALHOST:1", "[::1]:11435", "app.localhost",
                                  "printer.local", "host.docker.internal", "192.168.1.10", "10.0.0.2:80", "0.0.0.0"])
def test_local_hosts_are_answered(host):
    c = TestClient(create_app(bind="127.0.0.1"), base_url=f"http://{host}")
    r = c.get("/api/version")
    assert r.status_code == 200, r.text


def test_machine_hostname_is_allowed():
    assert host_allowed(socket.gethostname())
    assert host_allowed(socket.gethostname().upper() + ":8080")


def test_served_name_is_allowed():
    assert host_allowed("myname.example:9000", served="myname.example")
    assert not host_allowed("other.example", served="myname.example")


def test_allowed_hosts_setting(monkeypatch):
    monkeypatch.setenv("OLLAPY_ALLOWED_HOSTS", "mybox.example, *.corp.example")
    c = TestClient(create_app(bind="127.0.0.1"), base_url="http://mybox.example:11435")
    assert c.get("/api/version").status_code == 200
    assert TestClient(c.app, base_url="http://a.b.corp.example").get("/api/version").status_code == 200
    assert TestClient(c.app, base_url="http://corp.example.evil").get("/api/version").status_code == 403
    assert TestClient(c.app, base_url="http://evil.example").get("/api/version").status_code == 403


def test_allowed_hosts_star_allows_any(monkeypatch):
    monkeypatch.setenv("OLLAPY_ALLOWED_HOSTS", "*")
    assert TestClient(create_app(bind="127.0.0.1"), base_url="http://evil.example").get("/api/version").status_code == 200


def test_bad_allowed_hosts_value_is_one_line(monkeypatch):
    from ollapy.errors import UsageError

    monkeypatch.setenv("OLLAPY_ALLOWED_HOSTS", "http://x.example:80")
    with pytest.raises(UsageError, match="OLLAPY_ALLOWED_HOSTS"):
        create_app(bind="127.0.0.1")


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "192.168.1.5"])
def test_non_loopback_bind_checks_no_host(bind):
    """As Ollama: a server bound for other machines is reached by names it cannot know (use an API key)."""
    c = TestClient(create_app(bind=bind), base_url="http://evil.example")
    assert c.get("/api/version").status_code == 200


def test_default_bind_comes_from_ollapy_host(monkeypatch):
    monkeypatch.setenv("OLLAPY_HOST", "127.0.0.1:12345")
    assert TestClient(create_app(), base_url="http://evil.example").get("/api/version").status_code == 403
    monkeypatch.setenv("OLLAPY_HOST", "0.0.0.0:12345")
    assert TestClient(create_app(), base_url="http://evil.example").get("/api/version").status_code == 200


def test_rebinding_refused_before_the_api_key(monkeypatch):
    c = TestClient(create_app(bind="127.0.0.1", api_key="k"), base_url="http://evil.example")
    assert c.get("/api/tags", headers={"Authorization": "Bearer k"}).status_code == 403
