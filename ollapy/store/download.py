"""Blob downloads: resumable HTTP (httpx) with sha256 computed while streaming, under a file lock.

Bytes go to ``blobs/sha256-<hex>-partial``; after the last byte the size and
sha256 are checked and only then is the file renamed to ``blobs/sha256-<hex>``.
A partial left by an interrupted pull is resumed with ``Range``. Network
errors, truncated bodies and 5xx answers are retried with exponential backoff
(``OLLAPY_PULL_RETRIES``, default 6). A digest mismatch deletes the partial.
``ENOSPC`` raises :class:`~ollapy.errors.DiskFullError` and keeps the partial.
One process at a time fetches a given blob: the others wait on its lock and
then find it complete.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ollapy import config
from ollapy.errors import DiskFullError, DownloadError
from ollapy.store.layout import Store, digest_hex
from ollapy.store.progress import QuietProgress

CHUNK = 1 << 20
BACKOFF_S = 0.5
"""First retry delay in seconds; doubles per retry, capped at 8 s."""


class NotAtSource(DownloadError):
    """The source answered 4xx (404, 401...): retrying it will not help; try another source."""

    status = 404


class _Retryable(Exception):
    pass


def pull_retries() -> int:
    """Retry budget per blob from ``OLLAPY_PULL_RETRIES`` (default 6)."""
    return config.pull_retries()


@contextlib.contextmanager
def blob_lock(store: Store, digest: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock for one blob (``fcntl.flock`` on ``locks/sha256-<hex>.lock``).

    Blocks while another process holds it, calling ``on_wait()`` once first
    (to tell the user why nothing moves).
    """
    d = store.root / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"sha256-{digest_hex(digest)}.lock", "a+b") as f:
        try:
            import fcntl

            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # Windows
            import msvcrt

            msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
        yield


def _waiting(progress: QuietProgress, label: str) -> Callable[[], None]:
    return lambda: progress.stage(f"{label}: another pull is fetching it; waiting for that one to finish")


def _write_chunk(f: Any, data: bytes) -> None:
    """Write all of ``data`` to the unbuffered file ``f`` (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view):]


def _write_block(f: Any, data: bytes, store: Store) -> None:
    """``_write_chunk``, with ENOSPC turned into DiskFullError naming the blob directory."""
    try:
        _write_chunk(f, data)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _disk_full(store) from None
        raise


def _disk_full(store: Store) -> DiskFullError:
    return DiskFullError(
        f"no space left on device while writing to {store.blobs}",
        hint="free some disk space and pull again; the partial download is kept and will resume",
    )


def _finish(store: Store, hexd: str, h: hashlib._Hash, got: int, size: int | None, label: str) -> Path:
    partial = store.partial_path(hexd)
    if (size is not None and got != size) or h.hexdigest() != hexd:
        partial.unlink(missing_ok=True)
        raise DownloadError(
            f"{label}: sha256 mismatch (got {got} bytes, sha256 {h.hexdigest()[:12]}; expected "
            f"{size if size is not None else '?'} bytes, sha256 {hexd[:12]}); partial file deleted",
            hint="the source served other bytes; pull again or use another source",
        )
    final = store.blob_path(hexd)
    os.replace(partial, final)
    return final


class _Held:
    """What the partial file holds: byte count and the running sha256 of exactly those bytes."""

    def __init__(self, path: Path) -> None:
        self.h = hashlib.sha256()
        self.got = 0
        if path.exists():
            with open(path, "rb") as f:
                while block := f.read(CHUNK):
                    self.add(block)

    def add(self, block: bytes) -> None:
        self.h.update(block)
        self.got += len(block)

    def reset(self) -> None:
        self.h, self.got = hashlib.sha256(), 0


class _Hasher:
    """Hashes blocks on a worker thread while the caller's thread receives and writes them.

    The caller writes each block to the partial file, then hands it over here.
    Blocks are batched to ~1 MiB per hand-over (fewer queue operations) and the
    queue is bounded (16 batches). hashlib releases the GIL, so on a machine
    with a spare core the sha256 runs beside the network reads: splitting the
    work as receive+write | hash is faster than receive | write+hash on a
    machine with few cores (scripts/bench_pull.py). ``queued`` counts bytes handed over;
    ``held`` (byte count + running sha256) covers them all once closed.
    """

    def __init__(self, held: _Held) -> None:
        import queue
        import threading

        self.held = held
        self.queued = held.got
        self.q: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=16)
        self.pending: list[bytes] = []
        self.pending_n = 0
        self.thread = threading.Thread(target=self._run, name="ollapy-blob-hasher", daemon=True)
        self.closed = False

    def _run(self) -> None:
        while (batch := self.q.get()) is not None:
            # one update per ~1 MiB: each update releases and retakes the GIL, and retaking it per 64 KiB
            # block (contended by the receiving thread) cost more than this join's copy
            self.held.add(batch[0] if len(batch) == 1 else b"".join(batch))

    def put(self, block: bytes) -> None:
        """Queue one block that is already in the file (waits while 16 batches are pending)."""
        self.pending.append(block)
        self.pending_n += len(block)
        self.queued += len(block)
        if self.pending_n >= CHUNK:
            self.q.put(self.pending)
            self.pending, self.pending_n = [], 0

    def close(self) -> None:
        """Hash what is pending and stop the worker; ``held`` is then up to date."""
        if not self.closed:
            self.closed = True
            if self.pending:
                self.q.put(self.pending)
            self.q.put(None)
            self.thread.join()

    def __enter__(self) -> _Hasher:  # noqa: PYI034 - typing.Self needs 3.11
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def download_blob(store: Store, url: str, digest: str, size: int | None, *, label: str | None = None,
                  progress: QuietProgress | None = None, client: Any = None, headers: dict[str, str] | None = None,
                  retries: int | None = None) -> Path:
    """Fetch ``url`` into the blob for ``digest`` (``size`` bytes when known); return the blob path.

    Resumes an existing partial with ``Range``; retries network errors, 5xx and
    truncated bodies up to ``retries`` times. Raises NotAtSource (4xx),
    DownloadError (mismatch, retries exhausted) or DiskFullError (ENOSPC).
    """
    import httpx

    hexd = digest_hex(digest)
    label = label or f"sha256:{hexd[:12]}"
    progress = progress or QuietProgress()
    if store.has_blob(hexd, size):
        return store.blob_path(hexd)
    retries = pull_retries() if retries is None else retries
    store.blobs.mkdir(parents=True, exist_ok=True)
    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, connect=10.0))
    try:
        with blob_lock(store, hexd, _waiting(progress, label)):
            if store.has_blob(hexd, size):
                return store.blob_path(hexd)
            partial = store.partial_path(hexd)
            held = _Held(partial)
            if size is not None and held.got > size:
                partial.unlink()
                held.reset()
            task = progress.start(label, size, held.got)
            attempt = 0
            while size is None or held.got < size:
                try:
                    if _fetch_once(client, url, partial, held, size, headers or {}, progress, task, store):
                        break
                    raise _Retryable(f"connection closed after {held.got} of {size} bytes")
                except (_Retryable, httpx.TransportError) as exc:
                    attempt += 1
                    if attempt > retries:
                        raise DownloadError(f"{label}: {str(exc) or type(exc).__name__} (gave up after {retries} retries)",
                                            hint="check the network or the source and pull again; the download resumes") from None
                    time.sleep(min(BACKOFF_S * 2 ** (attempt - 1), 8.0))
            progress.finish(task)
            return _finish(store, hexd, held.h, held.got, size, label)
    finally:
        if own:
            client.close()


def _fetch_once(client, url: str, partial: Path, held: _Held, size: int | None, headers: dict[str, str],
                progress: QuietProgress, task: Any, store: Store) -> bool:
    """One GET (with Range when resuming), appending to ``partial``; True when the body reached its end."""
    # Byte ranges count the bytes as sent, so ask for them unencoded (as curl does), and skip
    # httpx's decoder layer unless a server encodes anyway.
    hdrs = {"Accept-Encoding": "identity", **headers}
    if held.got:
        hdrs["Range"] = f"bytes={held.got}-"
    with client.stream("GET", url, headers=hdrs) as r:
        if r.status_code == 416 and held.got:
            partial.unlink(missing_ok=True)
            held.reset()
            raise _Retryable("server refused the resume range; restarting")
        if r.status_code >= 500 or r.status_code in (408, 429):
            raise _Retryable(f"HTTP {r.status_code} from {url}")
        if r.status_code >= 400:
            raise NotAtSource(f"HTTP {r.status_code} from {url}", hint="the source does not have this blob")
        mode = "ab"
        if held.got and r.status_code != 206:  # server ignored Range: start over
            held.reset()
            mode = "wb"
        with open(partial, mode, buffering=0) as f, _Hasher(held) as hasher:
            encoded = r.headers.get("content-encoding", "identity").lower() != "identity"
            for block in (r.iter_bytes() if encoded else r.iter_raw()):
                if size is not None and hasher.queued + len(block) > size:
                    hasher.close()
                    partial.unlink(missing_ok=True)
                    held.reset()
                    raise DownloadError(f"{url}: server sent more than the expected {size} bytes; partial deleted")
                _write_block(f, block, store)
                hasher.put(block)
                progress.advance(task, len(block))
    return size is None or held.got >= size


def write_blob(store: Store, digest: str, size: int | None, chunks: Iterable[bytes], *, label: str,
               progress: QuietProgress | None = None) -> Path:
    """Write bytes from ``chunks`` into the blob for ``digest`` (verified, under the blob lock); return its path.

    For sources that cannot resume (a pip wheel): the partial is started over.
    Raises DownloadError on mismatch (partial deleted) and DiskFullError on ENOSPC.
    """
    hexd = digest_hex(digest)
    progress = progress or QuietProgress()
    store.blobs.mkdir(parents=True, exist_ok=True)
    with blob_lock(store, hexd, _waiting(progress, label)):
        if store.has_blob(hexd, size):
            return store.blob_path(hexd)
        h, got = hashlib.sha256(), 0
        task = progress.start(label, size)
        with open(store.partial_path(hexd), "wb", buffering=0) as f:
            for block in chunks:
                _write_block(f, block, store)
                h.update(block)
                got += len(block)
                progress.advance(task, len(block))
        progress.finish(task)
        return _finish(store, hexd, h, got, size, label)


def link_blob(store: Store, digest: str, src: Path, *, symlink: bool) -> bool:
    """Make ``blobs/sha256-<hex>`` point at ``src`` without copying: a symlink, or a hard link.

    Returns False when a hard link is impossible (other filesystem, no
    permission); the caller then records ``src`` as a reference instead.
    """
    hexd = digest_hex(digest)
    store.blobs.mkdir(parents=True, exist_ok=True)
    dst = store.blob_path(hexd)
    if dst.is_file():
        return True
    if os.path.lexists(dst):
        dst.unlink()
    try:
        if symlink:
            os.symlink(Path(src).resolve(), dst)
        else:
            os.link(src, dst)
        return True
    except OSError:
        return False
