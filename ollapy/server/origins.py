"""The ``Origin`` allow-list of ``ollapy serve``: which web pages may call the API, as Ollama's CORS rules.

A page on another site can make a browser send a "simple" request (``POST`` with ``Content-Type: text/plain``,
no preflight) to a loopback server. CORS only keeps the page from *reading* the answer, so the request would
still run: create or overwrite a model (``/api/create``), copy, pull, delete, or generate. Ollama refuses such
a request outright: its CORS middleware (gin-contrib/cors, configured in ``server/routes.go`` from
``envconfig.AllowedOrigins``) aborts with 403 when the ``Origin`` header is not allowed. This module does the
same:

- no ``Origin`` header (curl, SDKs, agents): allowed;
- a same-origin request (``Origin`` is ``http://`` or ``https://`` plus the request's own ``Host``, as
  gin-contrib/cors checks; the chat page at ``/``): allowed. DNS rebinding, where a foreign page becomes
  same-origin, is refused before this by :mod:`ollapy.server.hosts`;
- an origin of :data:`LOCAL_ORIGINS` (Ollama's defaults) or of ``OLLAPY_ORIGINS`` (``*`` wildcards, like
  ``OLLAMA_ORIGINS``): allowed, and :class:`starlette.middleware.cors.CORSMiddleware` adds the CORS headers;
- anything else, ``null`` included (sandboxed frames, ``file://`` pages in some browsers): 403 on every route
  and method, preflights included, in the caller's error format.
"""
from __future__ import annotations

import json
import re

from ollapy import config
from ollapy.server.hosts import error_body

# Ollama's default AllowedOrigins (envconfig): localhost, 127.0.0.1 and 0.0.0.0 over http/https with or without
# a port, and the app://, file://, tauri://, vscode-webview://, vscode-file:// schemes; OLLAPY_ORIGINS adds to it.
LOCAL_ORIGINS = [
    r"https?://localhost(:\d+)?",
    r"https?://127\.0\.0\.1(:\d+)?",
    r"https?://0\.0\.0\.0(:\d+)?",
    r"app://.*",
    r"file://.*",
    r"tauri://.*",
    r"vscode-webview://.*",
    r"vscode-file://.*",
]
HINT = "add it to OLLAPY_ORIGINS if this page may use the server"


def origin_regex() -> str:
    """One regex of allowed CORS origins: the local ones plus ``OLLAPY_ORIGINS`` (comma separated, ``*`` wildcards).

    Raises SettingError for a malformed ``OLLAPY_ORIGINS``."""
    pats = list(LOCAL_ORIGINS)
    for o in config.origins():
        pats.append(".*" if o == "*" else re.escape(o).replace(r"\*", ".*"))
    return "^(" + "|".join(pats) + ")$"


def origin_allowed(origin: str, host: str, allowed: re.Pattern) -> bool:
    """True when a request with ``Origin: origin`` and ``Host: host`` may run (rules in the module docstring)."""
    if not origin:
        return True
    if host and origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower()):
        return True
    return allowed.fullmatch(origin) is not None


class OriginCheck:
    """Pure ASGI middleware: 403 to an HTTP request whose ``Origin`` is neither same-origin nor allowed
    (:func:`origin_allowed`), and a WebSocket handshake from such a page closed with 1008."""

    def __init__(self, app, pattern: str | None = None) -> None:
        self.app = app
        self.allowed = re.compile(pattern or origin_regex())

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        if origin_allowed(origin, host, self.allowed):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        text = f"origin {origin!r} is not allowed on this server ({HINT})"
        body = json.dumps(error_body(scope.get("path", ""), text, "origin_not_allowed")).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
