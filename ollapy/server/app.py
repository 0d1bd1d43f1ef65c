"""The FastAPI application of ``ollapy serve``.

:func:`create_app` wires the runtime (loaded models), the metrics registry,
the Ollama routes (``/``, ``/api/*``: generation in ``ollama_routes``, model
management in ``model_routes``, embeddings in ``embed_routes``), the OpenAI routes (``/v1/*``) and
``/metrics``; CORS allows local origins by default (``OLLAPY_ORIGINS`` adds
more, like Ollama's ``OLLAMA_ORIGINS``) and a page of any other origin is refused
(:mod:`ollapy.server.origins`); request bodies are capped at
``OLLAPY_MAX_BODY`` bytes (blob uploads excepted: they stream to the store); with
``OLLAPY_API_KEY`` (or ``serve --api-key``) every route but ``GET /`` needs the key.
"""
from __future__ import annotations

import contextlib
import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ollapy import __version__, config
from ollapy.server.errors import RouteError, anthropic_error, error_headers, ollama_error, openai_error
from ollapy.server.metrics import Metrics
from ollapy.server.openai.responses.store import ResponseStore
from ollapy.server.scheduler import Runtime

log = logging.getLogger("ollapy.server")

class State:
    """What the routes share: the runtime, the metrics and the stored ``/v1/responses`` (bounded by
    ``OLLAPY_RESPONSES_STORE``)."""

    def __init__(self, runtime: Runtime, metrics: Metrics | None) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.responses = ResponseStore(config.responses_store_bytes())


class BodyLimit:
    """Pure ASGI middleware: refuse request bodies over ``limit`` bytes with 413 (``/api/blobs`` exempt)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith("/api/blobs/") or self.limit <= 0:
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    if int(v) > self.limit:
                        return await _too_large(send, self.limit)
                except ValueError:
                    pass
        seen = 0
        limit = self.limit

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge()
            return msg

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await _too_large(send, limit)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send, limit: int) -> None:
    body = json.dumps({"error": f"request body larger than {limit} bytes (raise OLLAPY_MAX_BODY)"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def create_app(runtime: Runtime | None = None, *, allow_paths: bool = False, defaults: dict | None = None,
               api_key: str | None = None, bind: str | None = None, webui: bool | None = None) -> FastAPI:
    """Build the app. ``runtime`` defaults to a new :class:`Runtime` from the OLLAPY_* settings.

    ``allow_paths`` lets requests name a model by an absolute path to a GGUF
    file on the server (``serve --allow-paths``); by default only store names.
    ``api_key`` (default ``OLLAPY_API_KEY``; ``""`` = none) makes every route but
    ``GET /`` require it (:class:`~ollapy.server.auth.ApiKeyAuth`).
    ``bind`` (default ``OLLAPY_HOST``'s host) is the address the server listens on: when it is loopback, a
    request whose ``Host`` is not a local name is a 403 (:class:`~ollapy.server.hosts.HostCheck`, DNS rebinding).
    ``webui`` (default: on unless ``OLLAPY_NO_WEBUI``) serves the chat page to browsers at ``/``
    (:mod:`ollapy.server.webui`).
    The lifespan's exit unloads every model through its one ``close()``.
    """
    key = config.api_key() if api_key is None else api_key
    runtime = runtime or Runtime(allow_paths=allow_paths, defaults=defaults)
    metrics = Metrics(runtime)
    state = State(runtime, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        runtime.start()
        try:
            yield
        finally:
            await runtime.shutdown()

    app = FastAPI(title="ollapy", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ollapy = state
    app.state.webui = (not config.no_webui()) if webui is None else webui

    from ollapy.server.anthropic import routes as anthropic_routes
    from ollapy.server.llamacpp import infill as llamacpp_infill
    from ollapy.server.llamacpp import routes as llamacpp_routes
    from ollapy.server.ollama import embed as embed_routes
    from ollapy.server.ollama import models as model_routes
    from ollapy.server.ollama import routes as ollama_routes
    from ollapy.server.openai import embeddings as openai_embeddings
    from ollapy.server.openai import routes as openai_routes
    from ollapy.server.openai.responses import routes as responses_routes
    from ollapy.server.webui import router as webui_router

    app.include_router(ollama_routes.router)
    app.include_router(embed_routes.router)
    app.include_router(model_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(openai_embeddings.router)
    app.include_router(responses_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(webui_router)
    app.include_router(llamacpp_routes.router)
    app.include_router(llamacpp_infill.router)

    @app.get("/metrics", include_in_schema=False)
    async def _metrics():
        from fastapi.responses import Response

        from ollapy.server.metrics import CONTENT_TYPE

        return Response(metrics.render(), media_type=CONTENT_TYPE)

    from ollapy.errors import OllapyError, UsageError

    for cls in (OllapyError, ValueError, Exception):
        app.add_exception_handler(cls, lambda request, exc: error_response(request, exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):  # the router's 404 / 405, in the caller's format
        allow = (exc.headers or {}).get("Allow", "")
        resp = error_response(request, RouteError(exc.status_code, request.method, request.url.path, allow))
        if allow:
            resp.headers["Allow"] = allow
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(request, UsageError(str(exc.errors()[0].get("msg") if exc.errors() else exc)))

    if key:  # inside CORS, so a 401 still carries the CORS headers and preflights need no key
        from ollapy.server.auth import ApiKeyAuth

        app.add_middleware(ApiKeyAuth, key=key)
    from ollapy.server.origins import OriginCheck, origin_regex

    pattern = origin_regex()
    app.add_middleware(CORSMiddleware, allow_origin_regex=pattern, allow_methods=["*"], allow_headers=["*"],
                       allow_credentials=False)
    # a page of a foreign origin is refused outright (Ollama's gin-contrib/cors aborts with 403): CORS alone would
    # only hide the answer of a "simple" request, after /api/create or /api/pull had run
    app.add_middleware(OriginCheck, pattern=pattern)
    app.add_middleware(BodyLimit, limit=config.max_body())
    from urllib.parse import urlsplit

    from ollapy.server.hosts import HostCheck

    # a rebinding request is refused before CORS, the key or a body is looked at
    app.add_middleware(HostCheck, bind=bind or urlsplit(config.host()).hostname or "127.0.0.1",
                       extra=config.allowed_hosts())
    from ollapy.server.accesslog import AccessLog

    app.add_middleware(AccessLog)  # around everything: refused requests are logged too
    return app


def error_response(request: Request, exc: BaseException) -> JSONResponse:
    """The JSON error response for ``exc`` (Anthropic's shape under /v1/messages, OpenAI's under the rest of /v1,
    Ollama's elsewhere)."""
    if request.url.path.startswith("/v1/messages"):
        status, body = anthropic_error(exc)
    elif request.url.path.startswith("/v1"):
        status, body = openai_error(exc)
    else:
        status, body = ollama_error(exc)
    return JSONResponse(body, status_code=status, headers=error_headers(exc))
