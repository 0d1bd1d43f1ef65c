"""The prompt cache's block pool: KV blocks stored once, in RAM and on disk, with reference counts.

A saved sequence state is cut (:mod:`ollapy.cache.kvstate`) into blocks of
:data:`BLOCK_TOKENS` positions plus a tail. Block ``i`` of a prompt is named by
the chain hash the index computes for the prompt's first ``(i + 1) * B``
tokens (salt → block 1 → block 2 …, as in vLLM's automatic prefix caching and
LMCache's chunk keys), so two prompts that share their first ``k`` blocks of
tokens share the first ``k`` KV blocks. An entry is its tokens, the chain of
its block names and its tail (:class:`Split`).

RAM (:class:`BlockPool`): one copy of each block, with a reference count per
entry that holds it; a block is freed when its last entry lets go, so pinned
entries pin their blocks and ten conversations with one system prompt hold
its blocks once.

Disk: one file per block, ``<model dir>/blocks-<B>-k<layout>/<name>.kvb``,
content-addressed (the name is the content's identity), written under a
temporary name and *linked* into place (:func:`write_block`): two writers of one
block, in two processes or two replicas on a shared directory, leave one
valid file. A turn writes only the blocks that are not there yet; a block
already there is touched (its mtime is the grace clock of
:func:`collect_blocks`, so a block a writer is about to reference is never
collected under it). Blocks are immutable (copy-on-write: a conversation that
diverges inside a block gets a block of another name). A block file starts
with a small header (magic, version, crc32, length); a file of another version
or magic is never deleted.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ollapy.cache.filemap import map_view
from ollapy.cache.tempfiles import TMP_PREFIX, reapable

log = logging.getLogger("ollapy.cache")

BLOCK_TOKENS = 256  # positions per block; a multiple of the 64-token evaluation grid (choice: docs/prompt-cache.md)
BLOCK_SUFFIX = ".kvb"
BLOCK_MAGIC = b"OLLAPYKB"
BLOCK_VERSION = 1
KV_LAYOUT = 1  # the block byte layout of ollapy.cache.kvstate this code joins; part of the directory name
GRACE_S = 600.0  # an unreferenced block file younger than this may be about to be referenced: kept
_BHDR = struct.Struct("<8sIIQ")  # magic, version, crc32 of the data, data length
WRITE_CHUNK = 8 << 20

__all__ = ["BLOCK_TOKENS", "BlockPool", "Split", "block_dir", "collect_blocks", "delete_block", "map_block",
           "write_block"]


class BlockFileError(Exception):
    """A block file failed a check (truncated, checksum); ``unknown`` True for another format (never deleted)."""

    def __init__(self, msg: str, unknown: bool = False) -> None:
        super().__init__(msg)
        self.unknown = unknown


@dataclass
class Split:
    """A state cut into named blocks: ``names[i]`` names ``blocks[i]`` (B positions each), then ``tail``.

    ``state_len`` is the joined state's length in bytes.
    """

    names: list[str]
    blocks: list
    tail: bytes | bytearray | memoryview
    state_len: int

    @property
    def nbytes(self) -> int:
        """Bytes of blocks plus tail (what this state costs where nothing is shared)."""
        return sum(len(b) for b in self.blocks) + len(self.tail)


@dataclass
class _Held:
    data: object
    refs: int = 0
    last_used: float = field(default_factory=time.monotonic)


class BlockPool:
    """RAM copies of blocks, one per name, with reference counts.

    Not thread-safe: the owner (the RAM tier, under the cache's lock) serializes access.
    Invariant (:meth:`check`): every held block has ``refs >= 1`` and ``bytes`` is their total.
    """

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, name: str) -> bool:
        return name in self._held

    def get(self, name: str):
        """The bytes of block ``name``, or None."""
        h = self._held.get(name)
        return None if h is None else h.data

    def acquire(self, names: Sequence[str], blocks: Sequence) -> tuple[list, int]:
        """Take one reference on each named block, keeping ``blocks[i]`` for names not held yet.

        Returns ``(held, new)``: the pool's copy of each block (the one already
        held wins: one copy per name) and how many were new.
        """
        out, new = [], 0
        now = time.monotonic()
        for name, data in zip(names, blocks, strict=True):
            h = self._held.get(name)
            if h is None:
                h = self._held[name] = _Held(data)
                self.bytes += len(data)
                new += 1
            h.refs += 1
            h.last_used = now
            out.append(h.data)
        return out, new

    def release(self, names: Sequence[str]) -> int:
        """Drop one reference on each named block; returns how many blocks were freed (no entry holds them)."""
        freed = 0
        for name in names:
            h = self._held.get(name)
            if h is None:
                continue
            h.refs -= 1
            if h.refs <= 0:
                del self._held[name]
                self.bytes -= len(h.data)
                freed += 1
        return freed

    def refs(self, name: str) -> int:
        """Entries holding block ``name`` (0 when it is not held)."""
        h = self._held.get(name)
        return 0 if h is None else h.refs

    def shared_bytes(self) -> int:
        """Bytes of blocks that two or more entries hold."""
        return sum(len(h.data) for h in self._held.values() if h.refs > 1)

    def check(self) -> None:
        """Assert the invariants (the RAM tier calls it after every change)."""
        assert all(h.refs >= 1 for h in self._held.values()), "a block without a reference is held"
        assert self.bytes == sum(len(h.data) for h in self._held.values()), self.bytes


# ---- disk ------------------------------------------------------------------------------------
def block_dir(model_dir: Path, block_tokens: int) -> Path:
    """The directory of ``model_dir``'s blocks of ``block_tokens`` positions in this code's byte layout."""
    return model_dir / f"blocks-{block_tokens}-k{KV_LAYOUT}"


def block_path(model_dir: Path, block_tokens: int, name: str) -> Path:
    """Where block ``name`` lives."""
    return Path(block_file(os.fspath(block_dir(model_dir, block_tokens)), name))


def block_file(bdir: str, name: str) -> str:
    """Block ``name``'s path in block directory ``bdir``, joined as strings (a restore maps tens of blocks)."""
    return f"{bdir}{os.sep}{name}{BLOCK_SUFFIX}"


def _write_all(fd: int, parts: list) -> None:
    """Write ``parts`` (buffers) to ``fd`` in order, in as few ``writev`` calls as the kernel takes.

    The header goes out with the first chunk in one call: a 24-byte write of its own would leave the block's
    page cache in small folios, which a restore then maps with more page faults.
    """
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def write_block(path: Path, data, tmp_prefix: str, check: Callable[[], None] | None = None) -> bool:
    """Create block file ``path`` holding ``data`` unless it exists; True when this call wrote it.

    The bytes go to a temporary file (``tmp_prefix``, a writer's prefix:
    :mod:`ollapy.cache.tempfiles`) that is then hard-linked to ``path``: a link
    never replaces a file, so of two concurrent writers one links and the other
    finds the file there, and a reader never sees a partial block. A block that
    is already there gets its mtime refreshed instead (it is about to be
    referenced: :func:`collect_blocks` keeps it). ``check`` is called before
    each 8 MiB chunk (the writer's abort); whatever it raises removes the
    temporary file and propagates.
    """
    try:
        os.utime(path)
        return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    view = memoryview(data).cast("B")
    tmp = path.parent / f"{tmp_prefix}{os.urandom(4).hex()}{BLOCK_SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            head = _BHDR.pack(BLOCK_MAGIC, BLOCK_VERSION, zlib.crc32(view), len(view))
            for i in range(0, max(len(view), 1), WRITE_CHUNK):
                if check is not None:
                    check()
                _write_all(fd, [head, view[i:i + WRITE_CHUNK]] if i == 0 else [view[i:i + WRITE_CHUNK]])
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def map_block(path: Path) -> tuple[memoryview, int]:
    """Map block file ``path`` copy-on-write: ``(data view, expected crc32)``, the checksum not yet verified.

    The view holds no file descriptor (:func:`ollapy.cache.filemap.map_view`; a small block is read instead).

    Raises FileNotFoundError when the file vanished (not corruption) and
    :class:`BlockFileError` when it fails a check (``unknown`` for a file of
    another format or version, which must be left alone).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))  # no file object: a restore maps tens of blocks
    try:
        head = os.pread(fd, _BHDR.size, 0)
        if len(head) < _BHDR.size:
            raise BlockFileError("truncated block header")
        magic, version, crc, n = _BHDR.unpack(head)
        if magic != BLOCK_MAGIC or version != BLOCK_VERSION:
            raise BlockFileError(f"unknown block format {magic!r} v{version}", unknown=True)
        size = os.fstat(fd).st_size
        if size != _BHDR.size + n or n == 0:
            raise BlockFileError(f"block size {size} != {_BHDR.size + n}")
        view = map_view(fd, size)  # holds no descriptor (filemap): a RAM tier of mapped blocks costs no fds
    finally:
        os.close(fd)
    return view[_BHDR.size:], crc


class ChecksumsCheck:
    """The crc32s of several mapped views, computed on one thread while the caller restores the joined state.

    Like :class:`ollapy.cache.fileformat.PayloadCheck` for a chain of blocks and
    a tail: ``zlib.crc32`` releases the GIL, so the checks overlap the restore.
    ``bad`` names the views that failed (for the caller to condemn).
    """

    def __init__(self, items: list[tuple[str, memoryview, int]]) -> None:
        self._items = items
        self.bad: list[str] = []
        self._thread = threading.Thread(target=self._run, name="ollapy-crc32", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.bad = [name for name, view, crc in self._items if zlib.crc32(view) != crc]

    def ok(self) -> bool:
        """Wait for the checksums; True when every one matched."""
        self._thread.join()
        return not self.bad


def iter_block_files(model_dir: Path):
    """Yield ``(path, stat)`` of every block file under ``model_dir``'s block directories; reaps orphaned temp files."""
    try:
        subdirs = [d for d in os.scandir(model_dir) if d.name.startswith("blocks-") and d.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for d in subdirs:
        try:
            items = list(os.scandir(d.path))
            dir_mtime = d.stat().st_mtime
        except OSError:
            continue
        for f in items:
            try:
                st = f.stat()
            except OSError:
                continue
            if f.name.startswith(TMP_PREFIX):
                if reapable(f.name, st.st_mtime, dir_mtime):  # a writer killed mid-write
                    try:
                        os.unlink(f.path)
                    except OSError:
                        pass
                continue
            if f.name.endswith(BLOCK_SUFFIX):
                yield Path(f.path), st


def known_block(path: Path) -> bool:
    """True when ``path`` starts with this code's block header (a file it may delete); False otherwise or gone."""
    try:
        with open(path, "rb") as f:
            head = f.read(_BHDR.size)
    except OSError:
        return False
    if len(head) < _BHDR.size:
        return True  # ours, truncated (a block is linked into place whole, so only damage truncates one)
    magic, version, _, _ = _BHDR.unpack(head)
    return magic == BLOCK_MAGIC and version == BLOCK_VERSION


def delete_block(path: Path, listed: os.stat_result, grace: float = GRACE_S, now: float | None = None) -> int:
    """The one rule by which a block file is deleted once its caller found no entry naming it; the bytes freed.

    ``listed`` is the file's stat from the caller's listing. The file is deleted only when it is still that file
    (same ``(st_dev, st_ino)``: not unlinked and written again since), was not touched since (same mtime: a
    writer touches every block before it writes the entry naming it, :func:`write_block`), is older than
    ``grace`` seconds (a writer that touched it before the listing may not have renamed its entry into place
    yet), lies in a directory of this code's layout and starts with this code's header. Otherwise returns 0.
    What is left (a writer whose touch predates the grace and whose entry lands after the unlink) is caught at
    the restore: an entry naming a missing block is dropped at its first failed restore
    (:meth:`ollapy.cache.tiers.DiskTier.load`).
    """
    now = time.time() if now is None else now
    if not path.parent.name.endswith(f"-k{KV_LAYOUT}"):
        return 0  # another layout's blocks: never ours to delete
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if (st.st_dev, st.st_ino, st.st_mtime_ns) != (listed.st_dev, listed.st_ino, listed.st_mtime_ns):
        return 0
    if now - st.st_mtime < grace or not known_block(path):
        return 0
    try:
        os.unlink(path)
    except OSError:
        return 0
    return st.st_size


def collect_blocks(model_dir: Path, referenced: set[str], grace: float = GRACE_S, now: float | None = None) -> int:
    """Delete the block files under ``model_dir`` that no entry references, by the rule of :func:`delete_block`.

    ``referenced``: names listed by the directory's entry files. Returns the bytes freed.
    """
    freed = 0
    for path, st in list(iter_block_files(model_dir)):
        if path.name[: -len(BLOCK_SUFFIX)] not in referenced:
            freed += delete_block(path, st, grace, now)
    return freed
