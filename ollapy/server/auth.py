"""API-key authentication of ``ollapy serve`` (``OLLAPY_API_KEY``, ``serve --api-key`` / ``--api-key-file``).

As llama.cpp's server and vLLM do with ``--api-key``: when a key is set, every
request except ``GET /`` and ``HEAD /`` (the heartbeat load balancers and the
CLI ask) must carry it, as ``Authorization: Bearer KEY`` (what the OpenAI SDK
sends for ``api_key``) or ``x-api-key: KEY`` (what the Anthropic SDK sends).
The comparison is constant-time (:func:`hmac.compare_digest`). A missing or
wrong key is a 401 in the caller's own error format, so each official client
raises its own authentication error: Ollama's ``{"error": ...}`` under
``/api``, OpenAI's error object under ``/v1``, Anthropic's
``{"type": "error", "error": {"type": "authentication_error", ...}}`` under
``/v1/messages``. CORS preflights (``OPTIONS``) are answered by the CORS
middleware outside this one: browsers never send credentials on a preflight.
"""
from __future__ import annotations

import hmac
import json

MESSAGE = "missing or invalid API key"
HINT = "send the server's key as 'Authorization: Bearer KEY' or 'x-api-key: KEY' (the CLI sends OLLAPY_API_KEY)"
OPEN_PATHS = frozenset({"/"})
"""Paths any client may GET or HEAD without a key (the heartbeat, and the chat page, which then asks for the key)."""
OPEN_PREFIXES = ("/web/",)
"""Path prefixes any client may GET or HEAD without a key: the chat page's static files (public code, no data)."""


def presented_keys(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request presents: the token of each ``Authorization: Bearer TOKEN`` and each ``x-api-key``
    value (raw header bytes, ASGI's lower-cased names)."""
    out = []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                out.append(token.strip())
        elif name == b"x-api-key" and value.strip():
            out.append(value.strip())
    return out


def key_matches(expected: bytes, presented: list[bytes]) -> bool:
    """True when one of ``presented`` equals ``expected``; each comparison takes the same time wherever the
    first differing byte is (:func:`hmac.compare_digest`), and every presented key is compared."""
    ok = False
    for key in presented:
        ok |= hmac.compare_digest(expected, key)
    return ok


def unauthorized_body(path: str) -> dict:
    """The 401 body for ``path`` in its API's error shape (Anthropic, OpenAI or Ollama)."""
    text = f"{MESSAGE}: {HINT}"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return {"type": "error", "error": {"type": "authentication_error", "message": text}}
    if path == "/v1" or path.startswith("/v1/"):
        return {"error": {"message": text, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    return {"error": text}


class ApiKeyAuth:
    """Pure ASGI middleware: answer 401 (with ``WWW-Authenticate: Bearer``) to any HTTP request but
    ``GET``/``HEAD /`` that does not present ``key``. ``key`` must be non-empty."""

    def __init__(self, app, key: str) -> None:
        if not key:
            raise ValueError("ApiKeyAuth needs a non-empty key")
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if (path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)) and scope.get("method") in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        if key_matches(self.key, presented_keys(scope.get("headers", []))):
            return await self.app(scope, receive, send)
        body = json.dumps(unauthorized_body(path)).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="ollapy"')]})
        await send({"type": "http.response.body", "body": body})
