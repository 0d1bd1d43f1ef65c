"""The ``Host`` allow-list of ``ollapy serve``: a guard against DNS rebinding.

A page on ``evil.example`` whose name is re-pointed at 127.0.0.1 becomes
same-origin with a loopback server, so CORS cannot stop it; its requests still
carry ``Host: evil.example``. Ollama closed this hole (CVE-2024-28224) with a
middleware in ``server/routes.go`` (``allowedHostsMiddleware``); this module
follows its rules:

- A server bound to a non-loopback address (``0.0.0.0``, a LAN address) is
  meant to be reached by other names: no check (as Ollama). Protect such a
  server with an API key (``OLLAPY_API_KEY``) or a firewall.
- On a loopback bind, a ``Host`` is allowed when it is empty, an IP literal
  that is loopback, private, unspecified or one of this machine's addresses,
  ``localhost``, this machine's host name, a name under ``.localhost``,
  ``.local`` or ``.internal``, the served address itself, or a name in
  ``OLLAPY_ALLOWED_HOSTS`` (ollapy's addition: ``name``, ``*.domain``, ``*``).
- Anything else is a 403 on every route, in the caller's error format.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import json
import socket

LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
HINT = "add the name to OLLAPY_ALLOWED_HOSTS if you use it on purpose"


def split_host(value: str) -> str:
    """The lower-cased host name of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``, ``v6``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value  # a bare name, or a bare IPv6 address


def is_loopback_bind(bind: str) -> bool:
    """True when the listening address ``bind`` (a host name or IP literal) is loopback only."""
    name = split_host(bind)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def machine_addresses() -> set[str]:
    """This machine's IP addresses that its host name resolves to (best effort; empty when it resolves nowhere)."""
    out: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            out.add(str(info[4][0]).split("%", 1)[0])
    except OSError:
        pass
    return out


def host_allowed(host: str, served: str = "", extra: tuple[str, ...] = ()) -> bool:
    """True when a loopback-bound server may answer ``Host: host`` (rules in the module docstring).

    ``served``: the address the server listens on; ``extra``: names from ``OLLAPY_ALLOWED_HOSTS``."""
    name = split_host(host)
    if name in ("", "localhost") or name == split_host(served):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        ip = None
    if ip is not None:
        return ip.is_loopback or ip.is_private or ip.is_unspecified or name in machine_addresses()
    if name == socket.gethostname().lower() or name.endswith(LOCAL_SUFFIXES):
        return True
    return any(pat == "*" or fnmatch.fnmatchcase(name, pat) for pat in extra)


def error_body(path: str, text: str, code: str) -> dict:
    """A 403 body saying ``text`` for ``path`` in its API's error shape (Anthropic, OpenAI with ``code``, Ollama)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return {"type": "error", "error": {"type": "permission_error", "message": text}}
    if path == "/v1" or path.startswith("/v1/"):
        return {"error": {"message": text, "type": "invalid_request_error", "param": None, "code": code}}
    return {"error": text}


def forbidden_body(path: str, host: str) -> dict:
    """The 403 body for a refused ``Host`` on ``path`` in its API's error shape (Anthropic, OpenAI or Ollama)."""
    return error_body(path, f"host {host!r} is not allowed on this server ({HINT})", "host_not_allowed")


class HostCheck:
    """Pure ASGI middleware: 403 to an HTTP or WebSocket request whose ``Host`` a server bound to ``bind`` must
    not answer (:func:`host_allowed`); nothing is checked when ``bind`` is not loopback."""

    def __init__(self, app, bind: str, extra: list[str] | tuple[str, ...] = ()) -> None:
        self.app = app
        self.bind = bind
        self.active = is_loopback_bind(bind)
        self.extra = tuple(extra)

    async def __call__(self, scope, receive, send):
        if not self.active or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        host = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
        if host_allowed(host, self.bind, self.extra):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps(forbidden_body(scope.get("path", ""), host)).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
