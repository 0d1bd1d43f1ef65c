"""The two tiers of the prompt cache: an in-process RAM LRU and a shared disk directory.

RAM tier: entries holding their payload bytes (a whole state, or the tail of
a chain of blocks held once in its :class:`~ollapy.cache.blocks.BlockPool`),
bounded in bytes (tails plus blocks), least recently used first, entries that
served hits kept over ones that never did, pinned entries last. An evicted
entry lets go of its blocks; a block no entry holds is freed.

Disk tier: one directory per (model sha256, KV salt) under
``<root>/v2/`` (``v1/``, the whole-state layout of earlier versions, is left
alone: a process of that version deletes files of a version it does not
know); one file per entry, named by a hash of its tokens, plus one file per
block (:mod:`ollapy.cache.blocks`), written
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

from ollapy.cache.blocks import (
    BLOCK_SUFFIX,
    BlockFileError,
    BlockPool,
    ChecksumsCheck,
    block_dir,
    block_file,
    block_path,
    map_block,
    write_block,
)
from ollapy.cache.diskcap import (
    HIT,
    LAYOUT,
    PIN,
    delete_entry_files,
    disk_usage,
    enforce_disk_cap,
    iter_state_files,
)
from ollapy.cache.diskcap import unlink_quietly as _unlink
from ollapy.cache.fileformat import (
    SUFFIX,
    TMP_PREFIX,
    CacheFileError,
    FileReplaced,
    Header,
    PayloadCheck,
    UnknownFormat,
    map_payload,
    read_header,
    read_payload,
    write_file,
)
from ollapy.cache.tempfiles import pid_alive
from ollapy.cache.writer import CacheWriter, DrainResult

__all__ = ["HIT", "LAYOUT", "PIN", "DanglingEntry", "DiskTier", "Entry", "Parts", "RamTier", "condemn", "delete_entry_files",
           "disk_usage", "enforce_disk_cap", "iter_state_files", "pid_alive"]

log = logging.getLogger("ollapy.cache")



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
    blocks: tuple[str, ...] = ()  # names of the blocks its payload (then a tail) joins; () for a whole state
    block_tokens: int = 0
    interim: bool = False  # a conversation's save point that its next turn supersedes (see policy: write-behind)
    due: float = 0.0  # time.monotonic() when its deferred disk write is due; 0: no write deferred
    continued: str = ""  # how a request continued from it whole in this process: "restore", "slot", "" (never)

    @property
    def persisted(self) -> bool:
        """On disk, queued to be written, or with a deferred write (:attr:`due`)."""
        return self.on_disk or self.pending or self.due > 0


class DanglingEntry(Exception):
    """An entry names a block file that is gone: the entry file was dropped (:meth:`DiskTier.load`); a miss."""


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

    def __init__(self, cap: int, lock=None, before_evict=None) -> None:
        """``before_evict(entry)``, called while an evicted entry still holds its payload and blocks, may queue
        its disk write (an entry whose write was deferred exists nowhere else)."""
        self.cap = cap
        self.before_evict = before_evict
        self.entries: dict[str, Entry] = {}
        self.pool = BlockPool()
        self.tail_bytes = 0
        self.blocks_evicted = 0  # blocks freed because their last entry was evicted or dropped
        self._lock = lock

    @property
    def bytes(self) -> int:
        """Bytes held: every entry's payload (whole state or tail) plus each block once."""
        return self.tail_bytes + self.pool.bytes

    def _check(self) -> None:
        """Invariants: bytes == held payloads + blocks, every held entry has one, mutations hold the owner's lock."""
        assert self._lock is None or self._lock._is_owned(), "RAM tier mutated without its owner's lock"
        assert all(e.payload is not None for e in self.entries.values()), "an entry in the RAM tier lost its payload"
        assert self.tail_bytes == sum(len(e.payload) for e in self.entries.values()), self.tail_bytes
        self.pool.check()

    def blocks_of(self, e: Entry) -> list | None:
        """The RAM copies of ``e``'s blocks (None when ``e`` is not held)."""
        if e.name not in self.entries:
            return None
        return [self.pool.get(n) for n in e.blocks]

    def put(self, e: Entry, payload, blocks=None) -> list[Entry]:
        """Hold ``payload`` for ``e`` (a tail: then ``blocks`` are the data of ``e.blocks``, kept once per name);
        returns the entries whose payloads were dropped to fit the cap."""
        if e.name in self.entries:
            self.drop(e)
        new = sum(len(b) for n, b in zip(e.blocks, blocks or ()) if n not in self.pool)
        if len(payload) + new > self.cap:
            self._check()
            return []
        e.payload = payload
        self.entries[e.name] = e
        self.tail_bytes += len(payload)
        if e.blocks:
            self.pool.acquire(e.blocks, blocks)
        out = self.fit(keep=e)
        assert self.bytes <= self.cap and self.entries.get(e.name) is e, (self.bytes, self.cap)
        return out

    def fit(self, keep: Entry | None = None) -> list[Entry]:
        """Evict until under the cap: unpinned before pinned, unproven before proven, oldest first.

        Proven: restored more often than the one request that continued from it (:attr:`Entry.continued`). That
        request's own finished state serves the conversation's next turn, so a state it continued from goes
        before it, by age, and never outlives it for a hit the conversation already used."""
        out: list[Entry] = []
        while self.bytes > self.cap:
            victims = [x for x in self.entries.values() if x is not keep]
            if not victims:
                break
            v = min(victims, key=lambda x: (x.pinned, x.hits - bool(x.continued) > 0, x.last_used))
            if self.before_evict is not None:
                self.before_evict(v)
            self.drop(v)
            out.append(v)
        self._check()
        return out

    def drop(self, e: Entry) -> None:
        """Forget ``e``'s payload."""
        held = self.entries.pop(e.name, None)
        assert held is None or held is e, f"two entries named {e.name}"
        if held is not None:
            self.tail_bytes -= len(e.payload)
            self.blocks_evicted += self.pool.release(e.blocks)
        e.payload = None
        self._check()

    def pinned_bytes(self) -> int:
        """Bytes of pinned entries held in RAM (their tails, and their blocks once)."""
        names = {n for e in self.entries.values() if e.pinned for n in e.blocks}
        return (sum(len(e.payload) for e in self.entries.values() if e.pinned and e.payload is not None)
                + sum(len(self.pool.get(n)) for n in names))

    def logical_bytes(self) -> int:
        """What the held entries would take as whole states (the numerator of the dedupe ratio)."""
        return sum(e.nbytes for e in self.entries.values())


@dataclass
class Parts:
    """A block entry read from disk: its ``tail``, the data of its ``blocks`` (mapped), the running checksums."""

    tail: memoryview
    blocks: list
    check: ChecksumsCheck
    header: Header


@dataclass
class WriteCounts:
    """What queueing one entry write costs: bytes and blocks new to the disk, blocks already there."""

    nbytes: int = 0
    blocks_written: int = 0
    blocks_reused: int = 0


class DiskTier:
    """The directory of one (model, KV salt), plus its :class:`CacheWriter`.

    ``block_tokens``: the positions per block of the entries it writes;
    ``queue_bytes``: the writer's byte budget (:class:`~ollapy.cache.writer.CacheWriter`).
    """

    def __init__(self, root: Path, directory: Path, model_sha256: str, salt: dict, model_name: str, cap: int,
                 block_tokens: int = 256, queue_bytes: int | None = None) -> None:
        self.root = root
        self.dir = directory
        self.model_sha256 = model_sha256
        self.salt = salt
        self.model_name = model_name
        self.cap = cap
        self.block_tokens = block_tokens
        self.writer = CacheWriter(budget=queue_bytes)
        self.writer.tmp_dirs.add(directory)
        self.writer.tmp_dirs.add(block_path(directory, block_tokens, "x").parent)
        self.known_blocks: set[str] = set()  # block names on disk or queued, as far as this process knows
        self._queued_blocks: set[str] = set()  # block names queued with their bytes

    # ---- reading ---------------------------------------------------------------------------
    def listing(self) -> dict[str, tuple[Path, float, bool]]:
        """``name -> (path, mtime, pinned)`` of the entry files in this directory now (also refreshes the
        names of the blocks on disk)."""
        out = {}
        try:
            bdir = block_path(self.dir, self.block_tokens, "x").parent
            self.known_blocks = {n[: -len(BLOCK_SUFFIX)] for n in os.listdir(bdir) if n.endswith(BLOCK_SUFFIX)
                                 and not n.startswith(TMP_PREFIX)} | self.known_blocks_pending()
        except OSError:
            pass
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
        except UnknownFormat:
            return None  # another version's file: skipped, never deleted
        except CacheFileError as exc:
            condemn(path, exc.ident, str(exc))
            return None
        except OSError:
            return None  # vanished (another process evicted it)
        if hdr.blocks and hdr.block_tokens != self.block_tokens:
            return None  # blocks of another size: another configuration's entry, left alone
        return Entry(name=name, tokens=hdr.tokens, nbytes=hdr.state_len or hdr.payload_len, path=path, on_disk=True,
                     header=hdr, blocks=hdr.blocks, block_tokens=hdr.block_tokens)

    def load(self, e: Entry, defer_check: bool = False):
        """The entry's payload from disk, checked; None on any failure (a bad file is deleted).

        With ``defer_check`` the payload checksum is not awaited: returns
        ``(payload, PayloadCheck, header)``, the check running on its own thread
        while the caller restores (see :class:`~ollapy.cache.fileformat.PayloadCheck`);
        on a failed check the caller calls :meth:`condemn` with that header.
        Raises DanglingEntry when a block entry names a block that is gone (its file was dropped).
        A header cached since the directory was listed is re-read before the
        file is condemned: another process may have rewritten the file since.
        """
        for _ in range(2):
            cached = e.header is not None
            try:
                if e.header is None:
                    e.header = read_header(e.path, self.model_sha256, self.salt)
                if e.header.blocks:
                    return self._load_parts(e, e.header, defer_check)
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

    def _load_parts(self, e: Entry, hdr: Header, defer_check: bool) -> Parts | None:
        """Map a block entry's tail and blocks; the checksums run on their own thread (:class:`Parts`).

        None when a block file failed its header check (deleted when still the
        same file) or is of another format (left alone). Raises DanglingEntry
        when a block file vanished (a miss, not corruption: the entry file is
        dropped), and what :func:`map_payload` raises for the entry file.
        """
        tail = map_payload(hdr)
        items = [("tail", tail, hdr.payload_crc32)]
        views = []
        bdir = os.fspath(block_dir(self.dir, hdr.block_tokens))
        for name in hdr.blocks:
            path = block_file(bdir, name)
            try:
                view, crc = map_block(path)
            except FileNotFoundError:
                # an entry file is written only after every block it names (write_block, _write_blocks): one whose
                # block is gone is never whole again. Dropped now, unless rewritten since its header was read.
                log.debug("prompt cache: block %s of %s vanished; entry dropped", name, e.name)
                self.condemn(e, hdr, f"block {name} vanished")
                raise DanglingEntry(e.name) from None
            except BlockFileError as exc:
                if not exc.unknown:
                    _unlink(path)
                    self.known_blocks.discard(name)
                log.debug("prompt cache: block %s: %s", name, exc)
                return None
            except OSError:
                return None
            views.append(view)
            items.append((name, view, crc))
        parts = Parts(tail, views, ChecksumsCheck(items), hdr)
        if not defer_check and not parts.check.ok():
            self.condemn_parts(e, parts)
            return None
        return parts

    def condemn_parts(self, e: Entry, parts: Parts) -> None:
        """Delete what failed ``parts``' checksums: block files by name, the entry file unless rewritten since."""
        for name in parts.check.bad:
            if name == "tail":
                self.condemn(e, parts.header, "tail checksum mismatch")
            else:
                _unlink(block_path(self.dir, parts.header.block_tokens, name))
                self.known_blocks.discard(name)

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
    def known_blocks_pending(self) -> set[str]:
        """Names of blocks queued for writing (kept known while a listing runs)."""
        return set(self._queued_blocks)

    def write_async(self, e: Entry, payload, replaced: list[Entry], blocks=None) -> WriteCounts | None:
        """Queue a write of ``e`` (then deletion of the entries it replaces, then the cap); None when refused.

        ``payload`` is a whole state, or ``e``'s tail when ``e.blocks`` names
        blocks whose data ``blocks`` gives: only the blocks this process does
        not know on disk are queued with their bytes (the writer writes a block
        only where its file is missing, and touches the others). The writer's
        queue is bounded in bytes: a write that does not fit is refused.
        """
        new = [(n, b) for n, b in zip(e.blocks, blocks or (), strict=False) if n not in self.known_blocks]
        counts = WriteCounts(len(payload) + sum(len(b) for _, b in new), len(new), len(e.blocks) - len(new))
        if counts.nbytes > self.cap or (e.blocks and e.nbytes > self.cap):
            log.debug("prompt cache: state of %d bytes exceeds the disk cap; not written", e.nbytes)
            return None
        e.path = self.dir / f"{e.name}{SUFFIX}"
        e.pending = True
        data = dict(new)
        if not self.writer.submit(lambda check: self._write(e, payload, replaced, check, data), nbytes=counts.nbytes):
            e.pending = False
            return None
        self.known_blocks.update(data)
        self._queued_blocks.update(data)
        return counts

    def _write_blocks(self, e: Entry, data: dict, check) -> bool:
        """Write ``e``'s blocks that are missing on disk (touch the others); False when one is missing and this
        process no longer holds its bytes (the entry is then not written: it would name a missing block)."""
        for name in e.blocks:
            path = block_path(self.dir, e.block_tokens, name)
            if name in data:
                write_block(path, data[name], self.writer.tmp_prefix, check)
                continue
            try:
                os.utime(path)
            except FileNotFoundError:
                log.debug("prompt cache: block %s vanished before %s was written; entry not written", name, e.name)
                self.known_blocks.discard(name)
                return False
        return True

    def _write(self, e: Entry, payload, replaced: list[Entry], check, data: dict | None = None) -> None:
        try:
            if e.superseded:
                return
            if e.pinned:
                self.dir.mkdir(parents=True, exist_ok=True)
                e.path.with_suffix(PIN).touch()
            if e.blocks and not self._write_blocks(e, data or {}, check):
                return
            write_file(e.path, self.model_sha256, self.salt, self.model_name, e.tokens, payload, e.preview,
                       check=check, tmp_prefix=self.writer.tmp_prefix, blocks=e.blocks,
                       block_tokens=e.block_tokens, state_len=e.nbytes if e.blocks else 0)
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
            if data:
                self._queued_blocks.difference_update(data)

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until queued writes are done (at most ``timeout`` seconds); True when drained."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 120.0) -> DrainResult:
        """Drain the writer at normal priority and stop it (see :meth:`CacheWriter.close`)."""
        return self.writer.close(timeout)
