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

from ..errors import InvalidModelName

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
HF_HOSTS = ("hf.co", "huggingface.co")

_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}(:[0-9]{1,5})?$")
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
MAX_NAME = 350


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
        _check(_TAG, tag, "tag", tag)
        return ModelName(self.host, self.namespace, self.model, tag, self.digest)


def looks_like_path(text: str) -> bool:
    """True when ``text`` is meant as a file path (ends in ``.gguf`` with a dir part, or starts with ``./ / ~``)."""
    if text.startswith(("./", "../", "/", "~", ".\\")):
        return True
    low = text.lower()
    return low.endswith(".gguf") and ":" not in text and (Path(text).exists() or "/" not in text)


def _check(rx: re.Pattern[str], value: str, what: str, full: str) -> None:
    if not rx.match(value) or value in {".", ".."} or ".." in value:
        shown = full.replace("\x00", "\\0")
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise InvalidModelName(
            f"invalid model name {shown!r}: bad {what} {value[:40]!r}",
            hint="use [host/][namespace/]model[:tag] with letters, digits, '.', '-' and '_'",
        )


def parse_name(text: str) -> ModelName:
    """Parse and validate a model name; raises InvalidModelName with a one-line message."""
    raw = text.strip()
    if not raw or len(raw) > MAX_NAME or "\x00" in raw or "\\" in raw or raw.startswith("/"):
        shown = raw.replace("\x00", "\\0")[:60]
        raise InvalidModelName(f"invalid model name {shown!r}", hint="use [host/][namespace/]model[:tag]")
    digest = None
    if "@" in raw:
        raw, _, dig = raw.partition("@")
        m = _DIGEST.match(dig.lower())
        if not m:
            raise InvalidModelName(f"invalid digest in {text[:60]!r}", hint="use @sha256:<64 hex digits>")
        digest = m.group(1)
    path, tag = raw, DEFAULT_TAG
    last = raw.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = raw.rsplit(":", 1)
    pieces = path.split("/")
    if any(p == "" for p in pieces):
        raise InvalidModelName(f"invalid model name {text[:60]!r}: empty part", hint="use [host/][namespace/]model[:tag]")
    if pieces[0].lower().startswith(("https:", "http:")):
        raise InvalidModelName(f"invalid model name {text[:60]!r}: URLs are not names", hint="use host/namespace/model:tag")
    if len(pieces) == 1:
        host, ns, model = DEFAULT_HOST, DEFAULT_NAMESPACE, pieces[0]
    elif len(pieces) == 2:
        host, ns, model = DEFAULT_HOST, pieces[0], pieces[1]
    elif len(pieces) == 3:
        host, ns, model = pieces
    else:
        raise InvalidModelName(f"invalid model name {text[:60]!r}: too many '/' parts", hint="use [host/][namespace/]model[:tag]")
    # "host:port/ns/model" -- the tag split above only looked at the last part
    _check(_HOST, host, "host", text)
    _check(_PART, ns, "namespace", text)
    _check(_PART, model, "model", text)
    _check(_TAG, tag, "tag", text)
    if host.lower() == "huggingface.co":
        host = "hf.co"
    return ModelName(host.lower() if host.lower() in HF_HOSTS else host, ns, model, tag, digest)
