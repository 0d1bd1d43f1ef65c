"""The one place that maps exceptions to HTTP status codes and error bodies.

Ollama routes answer ``{"error": "message"}``; OpenAI routes answer
``{"error": {"message", "type", "param", "code"}}``; Anthropic's ``/v1/messages``
answers ``{"type": "error", "error": {"type", "message"}}``. Once a stream has started
the status can no longer change, so the error becomes the stream's last
line (NDJSON ``{"error": ...}``) or SSE event, as Ollama does.
"""
from __future__ import annotations

import json
import logging
import re

from ollapy import config
from ollapy.errors import Cancelled, ContextOverflow, ModelNotFound, OllapyError, describe

log = logging.getLogger("ollapy.server")

CLIENT_GONE = 499


class RouteError(OllapyError):
    """An unknown route (404) or a method the route does not take (405), raised for the router's HTTPException
    so that it answers in the caller's error format like every other error."""

    def __init__(self, status: int, method: str, path: str, allow: str = "") -> None:
        if status == 405:
            super().__init__(f"method {method} not allowed on {path}", hint=f"use {allow}" if allow else "")
        elif status == 404:
            super().__init__(f"no such endpoint: {method} {path}", hint="check the URL")
        else:
            super().__init__(f"{method} {path}: HTTP {status}")
        self.status = status
        self.allow = allow
        self.public = str(self)  # the client's own URL, not a server path: shown as it is


def is_validation_error(exc: BaseException) -> bool:
    """True for the errors that mean "the request was malformed": pydantic's ValidationError, a JSON document
    that does not parse, bytes that are not UTF-8. A bare ``ValueError``, ``TypeError`` or ``KeyError`` is not
    one: raised inside ollapy it is a bug, and must be a 500 that is logged, not a 400 the client is blamed for."""
    import pydantic

    return isinstance(exc, (pydantic.ValidationError, json.JSONDecodeError, UnicodeDecodeError))


def status_for(exc: BaseException) -> int:
    """HTTP status for an exception: the OllapyError's ``status`` (400 usage errors such as bad options, 404
    unknown model, 503 busy, 499 client gone, 507 disk full...), 400 for a validation error
    (:func:`is_validation_error`), else 500."""
    if isinstance(exc, OllapyError):
        return exc.status
    if is_validation_error(exc):
        return 400
    return 500


INTERNAL = "internal error"


# an absolute path in a message: after a space, quote, bracket or '=' (so no URL), not an API route in a hint
# (a lone "/" between words, as in "A / B", is no path)
_SERVER_PATH = re.compile(r"""(?:(?<=^)|(?<=[\s'"(\[=]))~?/(?!api/|v1/)[^\s'"()<>\[\],;:]+""")


def redact_paths(text: str) -> str:
    """``text`` with every server filesystem path replaced by ``<path>`` (API errors never show them)."""
    return _SERVER_PATH.sub("<path>", text)


def message_for(exc: BaseException) -> str:
    """The one-line message (with hint) a client is told, never with a server path.

    An error's ``public`` words are used as they are (written for clients: no
    server paths, no catalogue listing; unknown models get a pull hint);
    every other message has its absolute paths replaced (:func:`redact_paths`).
    """
    pull = f" (try `ollapy pull {getattr(exc, 'name', None) or 'NAME'}`)"
    if not isinstance(exc, OllapyError) and not is_validation_error(exc):  # a bug: one line, the log has the rest
        return redact_paths(f"{INTERNAL}: {describe(exc)} (the server log has the traceback; please report it)")
    if isinstance(exc, OllapyError) and exc.public:
        return exc.public + (pull if isinstance(exc, ModelNotFound) and not exc.pulled else "")
    if isinstance(exc, ModelNotFound) and not exc.hint:
        return redact_paths(f"{exc.message}{pull}")
    return redact_paths(describe(exc))


def log_error(exc: BaseException, status: int) -> None:
    """Log 5xx errors: an unexpected exception (not an OllapyError) always with its traceback, the others with
    it under OLLAPY_DEBUG. A 503 the server chose (busy, overloaded: the client is told to retry) is a warning,
    not an error."""
    if status >= 500 and not isinstance(exc, Cancelled):
        chosen = isinstance(exc, OllapyError)
        log.log(logging.WARNING if status == 503 and chosen else logging.ERROR, "%s", message_for(exc),
                exc_info=exc if config.debug() or not chosen else None)
    else:
        log.debug("request failed (%d): %s", status, message_for(exc))


def ollama_error(exc: BaseException) -> tuple[int, dict]:
    """``(status, {"error": message})`` for Ollama routes."""
    status = status_for(exc)
    log_error(exc, status)
    return status, {"error": message_for(exc)}


def openai_error(exc: BaseException) -> tuple[int, dict]:
    """``(status, {"error": {...}})`` in OpenAI's error shape."""
    status = status_for(exc)
    log_error(exc, status)
    # as OpenAI: unknown models, unknown URLs and wrong methods are all invalid_request_error
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
            413: "invalid_request_error", 503: "server_busy", 499: "client_closed"}.get(status, "api_error")
    code = "model_not_found" if isinstance(exc, ModelNotFound) else exc.code if isinstance(exc, OllapyError) else None
    message = message_for(exc)
    if isinstance(exc, ContextOverflow):  # OpenAI's words and code, which clients match to trim and retry
        code = "context_length_exceeded"
        message = (f"This model's maximum context length is {exc.num_ctx} tokens. However, your messages resulted in "
                   f"{exc.tokens} tokens, more than the {exc.limit} a prompt may take (raise num_ctx or shorten the "
                   "messages).")
    return status, {"error": {"message": message, "type": kind, "param": "messages" if code ==
                              "context_length_exceeded" else None, "code": code}}


#: Anthropic's error ``type`` by HTTP status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                         429: "rate_limit_error", 499: "invalid_request_error", 500: "api_error",
                         502: "api_error", 529: "overloaded_error"}
OVERLOADED = 529  # Anthropic's status for "overloaded" (ollapy's 503 busy): its SDKs and Claude Code retry it


def anthropic_error(exc: BaseException) -> tuple[int, dict]:
    """``(status, {"type": "error", "error": {"type", "message"}})`` in Anthropic's shape for ``/v1/messages``.

    A busy server (503) is Anthropic's 529 ``overloaded_error``; a prompt that does not fit is a 400
    ``invalid_request_error`` starting ``prompt is too long: N tokens > M maximum``."""
    status = status_for(exc)
    log_error(exc, status)
    if status == 503:
        status = OVERLOADED
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": message_for(exc)}}


def anthropic_error_event(exc: BaseException) -> bytes:
    """The final SSE ``error`` event of an Anthropic stream that failed after it started."""
    _, body = anthropic_error(exc)
    return f"event: error\ndata: {json.dumps(body)}\n\n".encode()


RETRY_AFTER_S = 1  # seconds a client is told to wait after a 503 "busy" answer


def error_headers(exc: BaseException) -> dict[str, str]:
    """HTTP headers of an error response: ``Retry-After`` on a 503 (queue full, no room to load a model, a
    runner child that does not answer), as Ollama's and llama.cpp's servers ask clients to come back."""
    if status_for(exc) == 503:
        return {"Retry-After": str(int(getattr(exc, "retry_after", RETRY_AFTER_S)))}
    return {}


def stream_error_line(exc: BaseException) -> bytes:
    """The final NDJSON line of an Ollama stream that failed after it started."""
    _, body = ollama_error(exc)
    return (json.dumps(body) + "\n").encode()


def sse_error_event(exc: BaseException) -> bytes:
    """The final SSE event of an OpenAI stream that failed after it started."""
    _, body = openai_error(exc)
    return f"data: {json.dumps(body)}\n\n".encode()
