"""Atomic file replacement shared by the model store, the prompt cache, its stats and saved sessions."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Callable


def shared_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: ``0o666`` less the process umask.

    Read from ``/proc/self/status`` where the kernel reports it, because setting
    and restoring ``os.umask`` to read it races with other threads creating files.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def write_atomically(path: Path, write: Callable[[IO[bytes]], None], *, prefix: str = ".tmp-", suffix: str = "",
                     mode: int | None = None, fsync: bool = False) -> None:
    """Create ``path`` from ``write(file)`` via a temporary file in the same directory and ``os.replace``.

    Readers see the old file or the complete new one, never a half-written
    one; on any error (including KeyboardInterrupt) the temporary file is
    removed and the error re-raised. The file keeps ``mkstemp``'s private 0600
    unless ``mode`` is given (the model store passes :func:`shared_mode`, as
    Ollama's store files are world-readable); ``fsync`` flushes it to disk
    before the rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit, as Go programs (Ollama) do at start.

    A server holds a descriptor per client connection, per model file and projector, per runner pipe and per
    cache file being written; the usual soft limit of 1,024 is a default for ``select()``-era programs, not a
    bound the kernel needs (Python's event loops use epoll). Children inherit the raised limit. Returns the
    ``(old soft, new soft)`` limits, or None where the limit cannot be read or raised (logged by nobody: the
    process then runs with what it was given).
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft >= hard:
            return soft, soft
        new = hard
        if new == resource.RLIM_INFINITY:  # Linux refuses an infinite nofile; stay at fs.nr_open's default
            new = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return soft, new
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on every platform
        return None
