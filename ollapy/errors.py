"""One exception hierarchy with actionable messages.

Every error ollapy raises on purpose is an :class:`OllapyError`: a one-line
``message`` plus a ``hint`` saying what to do next, an ``exit_code`` for the
CLI and a ``status`` for the HTTP server. ``describe`` maps any exception to
that line, so the CLI and the server show the same words.
"""
from __future__ import annotations


class OllapyError(Exception):
    """Base error: ``message`` (one line), ``hint`` (what to do next), exit code and HTTP status."""

    exit_code = 1
    status = 500

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f" ({self.hint})" if self.hint else "")


class UsageError(OllapyError):
    """The user asked for something malformed (bad option, bad value). Exit 2 / HTTP 400."""

    exit_code = 2
    status = 400


class OptionError(UsageError):
    """An unknown option name or a bad option value."""


class ModelNotFound(OllapyError):
    """No model of that name in the store or catalogue. HTTP 404."""

    status = 404


class ModelLoadError(OllapyError):
    """A GGUF file could not be loaded (missing, truncated, not GGUF, a directory)."""

    status = 400


class BusyError(OllapyError):
    """Every slot is busy and the wait queue is full. HTTP 503."""

    status = 503


class ContextError(OllapyError):
    """A prompt does not fit the context and truncation is off. HTTP 400."""

    status = 400


class DecodeError(OllapyError):
    """``llama_decode`` failed for the batch this request was in."""

    status = 500


class Cancelled(OllapyError):
    """The request was cancelled (client gone, Ctrl-C). HTTP 499, exit 130."""

    exit_code = 130
    status = 499


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
