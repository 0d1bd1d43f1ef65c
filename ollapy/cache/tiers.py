"""The two tiers of the prompt cache: an in-process RAM LRU and a shared disk directory.

RAM tier: entries holding their payload bytes, bounded in bytes, least
recently used first, entries that served hits kept over ones that never did,
pinned entries last.

Disk tier: one directory per (model sha256, KV salt) under
``<root>/v1/``; one file per entry, named by a hash of its tokens, written
by a :class:`~ollapy.cache.writer.CacheWriter` thread (tmp name + rename) so
decoding never waits on disk.
The index is derived from the directory listing and the file headers: no
shared mutable index file, so processes sharing the directory only ever race
on atomic renames and unlinks, which readers tolerate. A file's mtime is its
last use (touched on every hit); ``<name>.hit`` marks entries that served a
hit; ``<name>.pin`` marks pinned entries (written before the state file is
renamed into place, so a pinned entry is never seen unpinned).
Temporary files are named and reaped by the rules of :mod:`.tempfiles`.

A file that fails a check is deleted only while its path still names the
file that failed (:func:`condemn`): another process may have renamed a valid
file into its place since this one read the header.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ollapy.cache.fileformat import (
    SUFFIX,
    TMP_PREFIX,
    CacheFileError,
    FileReplaced,
    Header,
    PayloadCheck,
    map_payload,
    read_header,
    read_payload,
    write_file,
)
from ollapy.cache.tempfiles import pid_alive, reapable
from ollapy.cache.writer import CacheWriter, DrainResult

__all__ = ["DiskTier", "Entry", "RamTier", "condemn", "delete_entry_files", "disk_usage", "enforce_disk_cap",
           "iter_state_files", "pid_alive"]

log = logging.getLogger("ollapy.cache")

LAYOUT = "v1"
PIN = ".pin"
HIT = ".hit"


@dataclass(eq=False)
class Entry:
    """One saved prefix state. ``payload`` is set while it lives in the RAM tier."""

    name: str
    tokens: list[int]
    nbytes: int
    pinned: bool = False
    payload: bytes | bytearray | None = None
    path: Path | None = None
    on_disk: bool = False
    pending: bool = False
    superseded: bool = False
    hits: int = 0
    last_used: float = field(default_factory=time.time)
    header: object = None
    preview: str = ""
    refused: bool = False  # llama.cpp refused it in this process (e.g. longer than num_ctx): skipped, kept on disk

    @property
    def persisted(self) -> bool:
        """On disk, or queued to be written."""
        return self.on_disk or self.pending


def _unlink(p: Path) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("could not delete %s: %s", p, exc)


def delete_entry_files(path: Path, keep_pin: bool = False) -> None:
    """Delete a state file and its sidecars (missing files are fine)."""
    _unlink(path)
    _unlink(path.with_suffix(HIT))
    if not keep_pin:
        _unlink(path.with_suffix(PIN))


def condemn(path: Path, ident: tuple[int, int] | None, why: str) -> bool:
    """Delete the state file at ``path`` (and its sidecars) that failed a check, if ``path`` still names it.

    ``ident`` is the ``(st_dev, st_ino)`` of the file that failed. When another
    process renamed a new file into place since (a replica rewrote the entry),
    that file is left alone: returns False. None (the failing file was never
    opened) deletes nothing either.
    """
    try:
        st = os.stat(path)
    except OSError:
        return False
    if ident is None or (st.st_dev, st.st_ino) != tuple(ident):
        log.debug("prompt cache: %s failed (%s) but was rewritten since; kept", path.name, why)
        return False
    log.debug("prompt cache: dropping %s: %s", path.name, why)
    delete_entry_files(path)
    return True


class RamTier:
    """In-process LRU of entries with payloads, bounded by ``cap`` bytes.

    ``lock`` (optional): the owner's lock, which every mutation must hold
    (asserted, like the rest of the invariants: vLLM's ``block_pool.py`` style).
    """

    def __init__(self, cap: int, lock=None) -> None:
        self.cap = cap
        self.entries: dict[str, Entry] = {}
        self.bytes = 0
        self._lock = lock

    def _check(self) -> None:
        """Invariants: bytes == sum of held payloads, every held entry has one, mutations hold the owner's lock."""
        assert self._lock is None or self._lock._is_owned(), "RAM tier mutated without its owner's lock"
        assert all(e.payload is not None for e in self.entries.values()), "an entry in the RAM tier lost its payload"
        assert self.bytes == sum(len(e.payload) for e in self.entries.values()), self.bytes

    def put(self, e: Entry, payload) -> list[Entry]:
        """Hold ``payload`` for ``e``; returns the entries whose payloads were dropped to fit the cap."""
        if e.name in self.entries:
            self.drop(e)
        if len(payload) > self.cap:
            self._check()
            return []
        e.payload = payload
        self.entries[e.name] = e
        self.bytes += len(payload)
        out = self.fit(keep=e)
        assert self.bytes <= self.cap and self.entries.get(e.name) is e, (self.bytes, self.cap)
        return out

    def fit(self, keep: Entry | None = None) -> list[Entry]:
        """Evict until under the cap: unpinned before pinned, never-hit before hit, oldest first."""
        out: list[Entry] = []
        while self.bytes > self.cap:
            victims = [x for x in self.entries.values() if x is not keep]
            if not victims:
                break
            v = min(victims, key=lambda x: (x.pinned, x.hits > 0, x.last_used))
            self.drop(v)
            out.append(v)
        self._check()
        return out

    def drop(self, e: Entry) -> None:
        """Forget ``e``'s payload."""
        held = self.entries.pop(e.name, None)
        assert held is None or held is e, f"two entries named {e.name}"
        if held is not None:
            self.bytes -= len(e.payload)
        e.payload = None
        self._check()

    def pinned_bytes(self) -> int:
        """Bytes of pinned entries held in RAM."""
        return sum(len(e.payload) for e in self.entries.values() if e.pinned and e.payload is not None)


def _reap_temp(f: os.DirEntry, dir_mtime: float) -> None:
    """Delete temporary file ``f`` when its writer is gone (rules of :mod:`.tempfiles`)."""
    try:
        mtime = f.stat().st_mtime
    except OSError:
        return
    if reapable(f.name, mtime, dir_mtime):  # a writer killed mid-write
        _unlink(Path(f.path))


def iter_state_files(root: Path):
    """Yield ``(path, stat, pinned, hit)`` for every state file under ``root`` (all models); reaps orphaned temp files."""
    base = root / LAYOUT
    try:
        dirs = list(os.scandir(base))
    except OSError:
        return
    for d in dirs:
        if not d.is_dir(follow_symlinks=False):
            continue
        try:
            names = list(os.scandir(d.path))
            dir_mtime = d.stat().st_mtime
        except OSError:
            continue
        present = {n.name for n in names}
        for f in names:
            if f.name.startswith(TMP_PREFIX):
                _reap_temp(f, dir_mtime)
                continue
            if not f.name.endswith(SUFFIX):
                continue
            try:
                st = f.stat()
            except OSError:
                continue
            stem = f.name[: -len(SUFFIX)]
            yield Path(f.path), st, (stem + PIN) in present, (stem + HIT) in present


def enforce_disk_cap(root: Path, cap: int, protect: set[str] = frozenset()) -> list[Path]:
    """Delete unpinned state files, least valuable first, until all files total ≤ ``cap``.

    Order: never-hit before hit, then oldest mtime (last use) first. Files
    named in ``protect`` (just written) go last. Returns the deleted paths.
    """
    files = list(iter_state_files(root))
    total = sum(st.st_size for _, st, _, _ in files)
    if total <= cap:
        return []
    victims = sorted((f for f in files if not f[2]), key=lambda f: (f[0].name in protect, f[3], f[1].st_mtime))
    deleted = []
    for path, st, _, _ in victims:
        if total <= cap:
            break
        delete_entry_files(path)
        total -= st.st_size
        deleted.append(path)
    if deleted:
        log.debug("disk cap %d: evicted %d file(s)", cap, len(deleted))
    return deleted


def disk_usage(root: Path) -> dict:
    """Bytes and file counts on disk: total, pinned."""
    total = pinned = n = n_pinned = 0
    for _, st, pin, _ in iter_state_files(root):
        total += st.st_size
        n += 1
        if pin:
            pinned += st.st_size
            n_pinned += 1
    return {"disk_bytes": total, "disk_files": n, "pinned_bytes": pinned, "pinned_files": n_pinned}




class DiskTier:
    """The directory of one (model, KV salt), plus its :class:`CacheWriter`."""

    def __init__(self, root: Path, directory: Path, model_sha256: str, salt: dict, model_name: str, cap: int) -> None:
        self.root = root
        self.dir = directory
        self.model_sha256 = model_sha256
        self.salt = salt
        self.model_name = model_name
        self.cap = cap
        self.writer = CacheWriter()
        self.writer.tmp_dirs.add(directory)

    # ---- reading ---------------------------------------------------------------------------
    def listing(self) -> dict[str, tuple[Path, float, bool]]:
        """``name -> (path, mtime, pinned)`` of the files in this directory now."""
        out = {}
        try:
            items = list(os.scandir(self.dir))
        except OSError:
            return out
        present = {i.name for i in items}
        for i in items:
            if i.name.startswith(TMP_PREFIX) or not i.name.endswith(SUFFIX):
                continue
            stem = i.name[: -len(SUFFIX)]
            try:
                mtime = i.stat().st_mtime
            except OSError:
                continue
            out[stem] = (Path(i.path), mtime, (stem + PIN) in present)
        return out

    def open_entry(self, name: str, path: Path) -> Entry | None:
        """Read and check a file's header; a bad file is deleted (:func:`condemn`; debug log says why)."""
        try:
            hdr = read_header(path, self.model_sha256, self.salt)
        except CacheFileError as exc:
            condemn(path, exc.ident, str(exc))
            return None
        except OSError:
            return None  # vanished (another process evicted it)
        return Entry(name=name, tokens=hdr.tokens, nbytes=hdr.payload_len, path=path, on_disk=True, header=hdr)

    def load(self, e: Entry, defer_check: bool = False):
        """The entry's payload from disk, checked; None on any failure (a bad file is deleted).

        With ``defer_check`` the payload checksum is not awaited: returns
        ``(payload, PayloadCheck, header)``, the check running on its own thread
        while the caller restores (see :class:`~ollapy.cache.fileformat.PayloadCheck`);
        on a failed check the caller calls :meth:`condemn` with that header.
        A header cached since the directory was listed is re-read before the
        file is condemned: another process may have rewritten the file since.
        """
        for _ in range(2):
            cached = e.header is not None
            try:
                if e.header is None:
                    e.header = read_header(e.path, self.model_sha256, self.salt)
                if defer_check:
                    view = map_payload(e.header)
                    return view, PayloadCheck(view, e.header.payload_crc32), e.header
                return read_payload(e.header)
            except CacheFileError as exc:
                e.header = None
                if cached or isinstance(exc, FileReplaced):
                    continue  # read the header again: the file may be another process's newer copy
                condemn(e.path, exc.ident, str(exc))
                return None
            except OSError:
                return None  # vanished (another process evicted it)
        return None

    def condemn(self, e: Entry, hdr: Header, why: str) -> bool:
        """Delete ``e``'s file, read through ``hdr``, that failed a check, unless it was rewritten since."""
        e.header = None
        return e.path is not None and condemn(e.path, hdr.ident, why)

    def touch(self, e: Entry) -> None:
        """Mark a hit: mtime = now (LRU) and the ``.hit`` sidecar (kept over never-hit entries)."""
        if e.path is None:
            return
        try:
            os.utime(e.path)
            e.path.with_suffix(HIT).touch()
        except OSError:
            pass

    def set_pin(self, e: Entry, pinned: bool) -> None:
        """Create or remove the pin sidecar of ``e``."""
        e.pinned = pinned
        if e.path is None:
            return
        try:
            if pinned:
                self.dir.mkdir(parents=True, exist_ok=True)
                e.path.with_suffix(PIN).touch()
            else:
                _unlink(e.path.with_suffix(PIN))
        except OSError:
            pass

    def delete(self, e: Entry) -> None:
        """Remove ``e``'s files (after pending writes, so a queued write cannot resurrect it)."""
        e.superseded = True
        if e.pending:
            def job(_check) -> None:
                if e.path is not None:
                    delete_entry_files(e.path)
                e.on_disk = False

            self.writer.submit(job, counts_as_state=False)
        elif e.path is not None:
            delete_entry_files(e.path)
            e.on_disk = False

    # ---- writing ---------------------------------------------------------------------------
    def write_async(self, e: Entry, payload, replaced: list[Entry]) -> bool:
        """Queue a write of ``e`` (then deletion of the entries it replaces, then the cap); False when refused."""
        if len(payload) > self.cap:
            log.debug("prompt cache: state of %d bytes exceeds the disk cap; not written", len(payload))
            return False
        e.path = self.dir / f"{e.name}{SUFFIX}"
        e.pending = True
        if not self.writer.submit(lambda check: self._write(e, payload, replaced, check)):
            e.pending = False
            return False
        return True

    def _write(self, e: Entry, payload, replaced: list[Entry], check) -> None:
        try:
            if e.superseded:
                return
            if e.pinned:
                self.dir.mkdir(parents=True, exist_ok=True)
                e.path.with_suffix(PIN).touch()
            write_file(e.path, self.model_sha256, self.salt, self.model_name, e.tokens, payload, e.preview,
                       check=check, tmp_prefix=self.writer.tmp_prefix)
            e.on_disk = True
            for r in replaced:
                if r.path is not None and r.path != e.path and not r.pending:
                    delete_entry_files(r.path, keep_pin=False)
                    r.on_disk = False
            enforce_disk_cap(self.root, self.cap, protect={e.path.name})
        except OSError as exc:
            log.debug("prompt cache: could not write %s: %s", e.path, exc)
        finally:
            e.pending = False

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until queued writes are done (at most ``timeout`` seconds); True when drained."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 120.0) -> DrainResult:
        """Drain the writer at normal priority and stop it (see :meth:`CacheWriter.close`)."""
        return self.writer.close(timeout)
