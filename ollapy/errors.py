"""One exception hierarchy with actionable messages.

Every error ollapy raises on purpose is an :class:`OllapyError`: a one-line
``message`` plus a ``hint`` saying what to do next, an ``exit_code`` for the
CLI and a ``status`` for the HTTP server. ``describe`` maps any exception to
that line, so the CLI and the server show the same words.
"""
from __future__ import annotations

import os


class OllapyError(Exception):
    """Base error: ``message`` (one line), ``hint`` (what to do next), exit code and HTTP status; ``code`` is the
    machine-readable ``error.code`` OpenAI's error object carries (None: none)."""

    exit_code = 1
    status = 500
    code: str | None = None

    def __init__(self, message: str, hint: str = "", *, public: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # what a remote (HTTP) client is told instead, when message/hint name server paths or listings
        self.public = public

    def __str__(self) -> str:
        return self.message + (f" ({self.hint})" if self.hint else "")


class UsageError(OllapyError):
    """The user asked for something malformed (bad option, bad value). Exit 2 / HTTP 400."""

    exit_code = 2
    status = 400


class OptionError(UsageError):
    """An unknown option name or a bad option value."""


class ModelNotFound(OllapyError):
    """No model of that name in the store or catalogue. HTTP 404. ``name``: the model asked for, when known
    (a server's pull hint names it); ``pulled``: True when a pull of it is what failed (then no pull hint)."""

    status = 404

    def __init__(self, message: str, hint: str = "", *, public: str | None = None, name: str | None = None,
                 pulled: bool = False) -> None:
        super().__init__(message, hint, public=public)
        self.name = name
        self.pulled = pulled


class ModelLoadError(OllapyError):
    """A GGUF file could not be loaded (missing, truncated, not GGUF, a directory)."""

    status = 400


class DraftMismatch(UsageError):
    """A draft model that cannot draft for the model: another vocabulary (engine.backend.vocab's rule). A usage
    error, the same (exit 2, HTTP 400) whether the CLI loads the model itself or asks a server."""

    def __init__(self, draft_name: str, target_name: str, why: str) -> None:
        hint = "a draft model must come from the same model family and tokenizer as the model"
        text = "draft model {} does not share the vocabulary of {} ({})"

        def file_name(name: str) -> str:  # a server's clients see a GGUF path as its file name, never the path
            return os.path.basename(name) if os.path.isabs(os.path.expanduser(name)) else name

        super().__init__(text.format(draft_name, target_name, why), hint=hint,
                         public=f"{text.format(file_name(draft_name), file_name(target_name), why)} ({hint})")


class BusyError(OllapyError):
    """Every slot is busy and the wait queue is full. HTTP 503."""

    status = 503


class ContextError(OllapyError):
    """A prompt does not fit the context and truncation is off. HTTP 400."""

    status = 400


class ContextOverflow(ContextError):
    """A chat prompt of ``tokens`` tokens leaves no room for the answer in a context of ``limit`` tokens (the most
    a prompt may take). HTTP 400; OpenAI's routes answer code ``context_length_exceeded``, Anthropic's
    ``prompt is too long: N tokens > M maximum`` (the words agents match in order to compact and retry)."""

    def __init__(self, tokens: int, limit: int, num_ctx: int) -> None:
        super().__init__(f"prompt is too long: {tokens} tokens > {limit} maximum (num_ctx {num_ctx})",
                         hint="shorten the conversation or raise num_ctx")
        self.tokens = tokens
        self.limit = limit
        self.num_ctx = num_ctx


class ImageError(UsageError):
    """An image a request sent cannot be used (bad base64, corrupt, unsupported format, too many or too large,
    a remote URL, a model without vision). Exit 2 / HTTP 400."""


class DecodeError(OllapyError):
    """``llama_decode`` failed for the batch this request was in."""

    status = 500


class DecodeAborted(DecodeError):
    """``llama_decode`` stopped at the abort flag (ollapy.engine.backend.abort): every request in its batch was
    cancelled. The engine ends those requests as :class:`Cancelled`; never reaches a client as itself."""


class Cancelled(OllapyError):
    """The request was cancelled (client gone, Ctrl-C). HTTP 499, exit 130."""

    exit_code = 130
    status = 499


class RunnerError(OllapyError):
    """A model's runner process died or stopped answering (for example ggml aborted after a lost RPC server).
    Only that request fails; the next one reloads the model. HTTP 502, exit 1."""

    status = 502


class RpcUnavailable(OllapyError):
    """An RPC server named in ``rpc`` could not be reached or failed the handshake (checked before any ggml call,
    whose client would abort the process). ``endpoint``: the HOST:PORT at fault. HTTP 502, exit 1."""

    status = 502

    def __init__(self, message: str, hint: str = "", *, public: str | None = None, endpoint: str = "") -> None:
        super().__init__(message, hint, public=public)
        self.endpoint = endpoint


class DownloadError(OllapyError):
    """A pull failed (network, digest mismatch, disk)."""

    status = 502


def describe(exc: BaseException) -> str:
    """Return the one-line message for any exception (hint appended in parentheses)."""
    if isinstance(exc, OllapyError):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or exc}: permission denied"
    if isinstance(exc, OSError) and exc.errno == 28:
        return f"no space left on device while writing {exc.filename or ''} (free some disk space and retry)".strip()
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class InvalidModelName(UsageError):
    """A model name that does not follow the grammar or could reach outside the store. Exit 2 / HTTP 400."""


class DiskFullError(DownloadError):
    """No space left while writing a blob; the partial file is kept for resume. HTTP 507."""

    status = 507


class CorruptManifest(OllapyError):
    """A manifest that is not valid JSON or lacks a model layer; ``ollapy rm`` removes it."""

    status = 500


class SettingError(UsageError):
    """An ``OLLAPY_*`` environment variable with a value that is invalid or out of range. Exit 2.

    The message names the variable, its value and what it accepts:
    ``OLLAPY_NUM_PARALLEL='abc' is not valid: expected an integer >= 1``.
    """

    def __init__(self, env: str, value: str, expected: str, hint: str = "") -> None:
        shown = value if len(value) <= 60 else value[:59] + "…"
        super().__init__(f"{env}={shown!r} is not valid: expected {expected}", hint=hint or f"fix or unset {env}")
        self.env = env
        self.value = value
        self.expected = expected


class PathNotAllowed(UsageError):
    """A request named a server file path where only store names and uploaded blobs are accepted. HTTP 400.

    The message never depends on whether the file exists (no existence oracle).
    """
