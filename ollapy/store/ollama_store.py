"""Read-only access to an existing Ollama store (``OLLAMA_MODELS`` or ``~/.ollama/models``).

Its layout is the same as ollapy's, so :class:`~ollapy.store.layout.Store` reads
it; ``read_only=True`` makes every write raise. Models there are listed and
run in place, without copying a byte.
"""
from __future__ import annotations

import os
from pathlib import Path

from ollapy.store.layout import Store


def ollama_root() -> Path:
    """``OLLAMA_MODELS`` or ``~/.ollama/models``."""
    raw = os.environ.get("OLLAMA_MODELS", "")
    return Path(raw).expanduser() if raw else Path.home() / ".ollama" / "models"


def ollama_store(exclude: Path | None = None) -> Store | None:
    """The Ollama store as a read-only Store, or None when absent (or the same directory as ``exclude``)."""
    root = ollama_root()
    if not (root / "manifests").is_dir():
        return None
    if exclude is not None and root.resolve() == Path(exclude).resolve():
        return None
    return Store(root, read_only=True)
