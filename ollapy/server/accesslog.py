"""One log line per HTTP request of ``ollapy serve``, as Ollama's server writes one (gin's logger).

The line goes to the ``ollapy.access`` logger at INFO once the response has ended (a stream when its last chunk is
sent, or when the client went away), so its duration is the whole request's::

    200 |   1.234s | 127.0.0.1 | POST /api/chat

A request that ends without a response start (the client left first) is logged with status ``-``. Query strings
are left out: they may carry a key.
"""
from __future__ import annotations

import logging
import time

log = logging.getLogger("ollapy.access")


class AccessLog:
    """ASGI middleware: logs each HTTP request's status, duration (seconds), client address, method and path."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status: list[int] = []

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            client = scope.get("client") or ("-", 0)
            log.info("%s | %8.3fs | %s | %s %s", status[0] if status else "-", time.perf_counter() - t0, client[0],
                     scope.get("method", "-"), scope.get("path", ""))
