"""Model name grammar and validation.

Accepted forms (case-insensitive for the store path):

* Ollama: ``[host/][namespace/]model[:tag][@sha256:<64 hex>]`` — defaults
  :data:`DEFAULT_HOST`, namespace ``library``, tag ``latest``.
* Hugging Face: ``hf.co/org/repo[:QUANT|:file.gguf]`` (also ``huggingface.co/``).
* A path to a ``.gguf`` file is not a name; see :func:`looks_like_path`.

Every part is checked against a strict character set and length, so no name
can reach outside the store (``..``, absolute paths, NUL, ``/`` inside a part).
Errors are :class:`~ollapy.errors.InvalidModelName` (exit 2, one line).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ollapy.errors import InvalidModelName

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
HF_HOSTS = ("hf.co", "huggingface.co")

MAX_PART = 80  # namespace and model
MAX_TAG = 128
MAX_HOST = 253  # without the ":port"
MAX_NAME = 350  # the whole text
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?$")
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
_LIMITS = {"host": MAX_HOST, "namespace": MAX_PART, "model": MAX_PART, "tag": MAX_TAG}
_RULES = {"host": _HOST, "namespace": _PART, "model": _PART, "tag": _TAG}


@dataclass(frozen=True)
class ModelName:
    """A validated model name. ``digest`` is 64 hex chars or None."""

    host: str
    namespace: str
    model: str
    tag: str
    digest: str | None = None

    @property
    def is_hf(self) -> bool:
        """True for ``hf.co/org/repo`` names."""
        return self.host in HF_HOSTS

    @property
    def repo_id(self) -> str:
        """``namespace/model`` as written (the Hugging Face repo id for HF names)."""
        return f"{self.namespace}/{self.model}"

    def display(self) -> str:
        """Short canonical text, Ollama-style: ``model:tag`` for the default host and namespace."""
        if self.is_hf:
            return f"hf.co/{self.namespace}/{self.model}:{self.tag}"
        if self.host == DEFAULT_HOST:
            base = self.model if self.namespace == DEFAULT_NAMESPACE else f"{self.namespace}/{self.model}"
        else:
            base = f"{self.host}/{self.namespace}/{self.model}"
        return f"{base}:{self.tag}"

    def parts(self) -> tuple[str, str, str, str]:
        """Lower-cased (host, namespace, model, tag): the manifest path below ``manifests/``."""
        host = "hf.co" if self.is_hf else self.host
        return (host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower())

    def with_tag(self, tag: str) -> ModelName:
        """Return a copy with another tag (validated)."""
        _check(tag, "tag", tag)
        return ModelName(self.host, self.namespace, self.model, tag, self.digest)


def looks_like_path(text: str) -> bool:
    """True when ``text`` is meant as a file path (ends in ``.gguf`` with a dir part, or starts with ``./ / ~``)."""
    if text.startswith(("./", "../", "/", "~", ".\\")):
        return True
    low = text.lower()
    return low.endswith(".gguf") and ":" not in text and ("/" not in text or _exists(text))


def _exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name too long for a path, or with a NUL: not a file here
        return False


def _shown(text: str, limit: int = 60) -> str:
    """Quote ``text`` for a one-line error: cut to ``limit`` characters ending in '…', control characters escaped."""
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _check(value: str, what: str, full: str) -> None:
    """Validate one part (``what`` is host, namespace, model or tag) of the name ``full``."""
    limit = _LIMITS[what]
    length = len(value.rsplit(":", 1)[0] if what == "host" else value)
    if length > limit:
        raise InvalidModelName(
            f"invalid model name {_shown(full)}: {what} is too long ({length} characters, the limit is {limit})",
            hint=f"use a {what} of at most {limit} characters",
        )
    if not _RULES[what].fullmatch(value) or value in {".", ".."} or ".." in value:
        raise InvalidModelName(
            f"invalid model name {_shown(full)}: bad {what} {_shown(value, 40)}",
            hint="use [host/][namespace/]model[:tag] with letters, digits, '.', '-' and '_'",
        )


def parse_name(text: str) -> ModelName:
    """Parse and validate a model name; raises InvalidModelName with a one-line message."""
    raw = text.strip()
    if len(raw) > MAX_NAME:
        raise InvalidModelName(
            f"invalid model name {_shown(raw)}: name is too long ({len(raw)} characters, the limit is {MAX_NAME})",
            hint=f"use a name of at most {MAX_NAME} characters",
        )
    if not raw or "\x00" in raw or "\\" in raw or raw.startswith("/"):
        raise InvalidModelName(f"invalid model name {_shown(raw)}", hint="use [host/][namespace/]model[:tag]")
    digest = None
    if "@" in raw:
        raw, _, dig = raw.partition("@")
        m = _DIGEST.match(dig.lower())
        if not m:
            raise InvalidModelName(f"invalid digest in {_shown(text)}", hint="use @sha256:<64 hex digits>")
        digest = m.group(1)
    path, tag = raw, DEFAULT_TAG
    last = raw.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = raw.rsplit(":", 1)
    pieces = path.split("/")
    if any(p == "" for p in pieces):
        raise InvalidModelName(f"invalid model name {_shown(text)}: empty part", hint="use [host/][namespace/]model[:tag]")
    if pieces[0].lower().startswith(("https:", "http:")):
        raise InvalidModelName(f"invalid model name {_shown(text)}: URLs are not names", hint="use host/namespace/model:tag")
    if len(pieces) == 1:
        host, ns, model = DEFAULT_HOST, DEFAULT_NAMESPACE, pieces[0]
    elif len(pieces) == 2:
        host, ns, model = DEFAULT_HOST, pieces[0], pieces[1]
    elif len(pieces) == 3:
        host, ns, model = pieces
    else:
        raise InvalidModelName(f"invalid model name {_shown(text)}: too many '/' parts", hint="use host/namespace/model")
    # "host:port/ns/model" -- the tag split above only looked at the last part
    _check(host, "host", text)
    _check(ns, "namespace", text)
    _check(model, "model", text)
    _check(tag, "tag", text)
    if host.lower() == "huggingface.co":
        host = "hf.co"
    return ModelName(host.lower() if host.lower() in HF_HOSTS else host, ns, model, tag, digest)
