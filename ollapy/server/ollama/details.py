"""Model descriptions as Ollama's API writes them, shared by ``/api/ps``, ``/api/tags`` and ``/api/show``."""
from __future__ import annotations

import datetime
import functools
from pathlib import Path

_GGUF_CACHE: dict[str, dict] = {}


def iso_time(ts: float | None) -> str:
    """A UTC timestamp as Ollama writes it (``Z`` suffix; Go's zero time for None)."""
    if ts is None:
        return "0001-01-01T00:00:00Z"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def model_details(info: dict | None) -> dict:
    """Ollama's ``details`` object from GGUF info."""
    info = info or {}
    arch = info.get("architecture") or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": str(info.get("parameters") or ""), "quantization_level": str(info.get("quantization") or "")}


def manifest_ids() -> dict[str, str]:
    """name -> the model's ID (manifest digest, :func:`ollapy.store.resolve.manifest_digest`): the same ID
    `ollapy list`, `ollapy ps` and /api/tags show."""
    from ollapy.store import list_models

    return {m.name: m.digest for m in list_models() if m.digest}


def gguf_info(path) -> dict:
    """GGUF metadata of ``path``, cached per path (``{}`` for None or an unreadable file)."""
    if path is None:
        return {}
    key = str(path)
    if key not in _GGUF_CACHE:
        try:
            from ollapy.store.info import read_gguf_info

            _GGUF_CACHE[key] = read_gguf_info(Path(path))
        except Exception:  # noqa: BLE001
            _GGUF_CACHE[key] = {}
    return _GGUF_CACHE[key]


def supports_insert(path, template: str | None) -> bool:
    """Ollama's ``insert`` capability: the GGUF has FIM tokens, or the (Jinja) template reads a ``suffix`` variable
    (a registry Go template's ``.Suffix``, translated), as the runner decides it."""
    from ollapy.chat.templates import template_reads_suffix

    try:
        st = Path(path).stat()
    except OSError:
        return template_reads_suffix(template)
    return _has_fim_tokens(str(path), st.st_mtime_ns, st.st_size) or template_reads_suffix(template)


@functools.lru_cache(maxsize=64)
def _has_fim_tokens(path: str, mtime_ns: int, size: int) -> bool:
    """store.info.has_fim_tokens, once per file version: reading a 151k-token vocabulary from the header takes
    ~140 ms, which every code completion paid before its load check (``ref_supports_insert``)."""
    from ollapy.store.info import has_fim_tokens

    return has_fim_tokens(Path(path))


def ref_supports_insert(ref) -> bool:
    """:func:`supports_insert` for a resolved model (its GGUF header and the template generation would use), read
    without loading it: Ollama refuses a ``suffix`` from the model's metadata before it schedules a load. True when
    the header cannot be read (the loaded model then decides)."""
    from ollapy.chat.templates import select_template

    path = getattr(ref, "path", None)
    info = gguf_info(path)
    if not info:
        return True
    chosen = select_template(info.get("chat_template"), info.get("architecture") or "", getattr(ref, "template", None))
    return supports_insert(path, chosen.text)
