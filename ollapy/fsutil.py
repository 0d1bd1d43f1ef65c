"""Atomic file replacement shared by the prompt cache, its stats and saved sessions."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable


def write_atomically(path: Path, write: Callable[[IO[bytes]], None], *, prefix: str = ".tmp-", suffix: str = "") -> None:
    """Create ``path`` from ``write(file)`` via a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the complete new one, never a half-written
    one; on any error (including KeyboardInterrupt) the temporary file is
    removed and the error re-raised.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
