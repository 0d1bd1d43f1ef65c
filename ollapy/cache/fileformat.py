"""The prompt-cache state file: header, token ids, payload, checksums.

Layout (little endian)::

    magic      8 bytes   b"OLLAPYKV"
    version    u32       FORMAT_VERSION
    hdr_len    u32       length of the JSON header
    hdr_sum    16 bytes  blake2b-128 of the JSON header
    header     JSON      model_sha256, salt (KV settings), model_name, n_tokens,
                         payload_len, payload_crc32, tokens_sum, created; version 2 adds
                         blocks (the chain of block names), block_tokens and state_len
    tokens     n_tokens * int32
    payload    payload_len bytes: the whole llama.cpp sequence state (no blocks), or the
               tail that joins the named blocks (:mod:`ollapy.cache.blocks`) back into it

A file of another magic or of a version this code does not know raises
:class:`UnknownFormat`: it is skipped and never deleted (replicas of another
version may share the directory).

Files are written to a temporary name in the same directory and renamed, so
readers see a whole file or none. Every check that fails raises
:class:`CacheFileError` with the reason; callers treat it as a miss and delete
the file. The payload checksum is zlib's crc32 (fast next to the restore itself), the small
parts use blake2b.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from ollapy.cache.filemap import map_view
from ollapy.cache.tempfiles import TMP_PREFIX as TMP_PREFIX  # re-exported: the name tests and tools match on
from ollapy.cache.tempfiles import writer_prefix
from ollapy.fsutil import write_atomically

MAGIC = b"OLLAPYKV"
FORMAT_VERSION = 2
KNOWN_VERSIONS = (1, 2)
SUFFIX = ".kv"
_FIXED = struct.Struct("<8sII16s")
_MAX_HEADER = 1 << 20


class CacheFileError(Exception):
    """A cache file failed a check; ``str(exc)`` says which.

    ``ident`` is the ``(st_dev, st_ino)`` of the file that failed, when it was
    opened: a caller deletes the path only while it still names that file
    (:func:`ollapy.cache.tiers.condemn`), never a valid file that another
    process renamed into its place since.
    """

    ident: tuple[int, int] | None = None


class UnknownFormat(CacheFileError):
    """Another magic or an unknown format version: not ours to judge, so never deleted (``ident`` stays None)."""


class FileReplaced(CacheFileError):
    """The path names another file than the checked header came from (rewritten by another process): re-read it."""


@dataclass
class Header:
    """A parsed, checked file header (the payload is not read yet)."""

    path: Path
    model_sha256: str
    salt: dict
    model_name: str
    tokens: list[int]
    payload_len: int
    payload_crc32: int
    payload_offset: int
    created: float
    size: int
    preview: str = ""
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file this header was read from
    blocks: tuple[str, ...] = ()  # names of the blocks the payload (a tail) joins; () for a whole state
    block_tokens: int = 0
    state_len: int = 0  # the joined state's bytes (payload_len for a whole state)


def _tokens_bytes(tokens) -> bytes:
    a = array("i", tokens)
    if a.itemsize != 4:  # pragma: no cover - exotic platforms
        a = array("l", tokens)
    return a.tobytes()


def encode(model_sha256: str, salt: dict, model_name: str, tokens: list[int], payload: bytes,
           preview: str = "", blocks: tuple[str, ...] = (), block_tokens: int = 0,
           state_len: int = 0) -> tuple[bytes, bytes]:
    """Return ``(head, payload)``: everything before the payload, and the payload itself."""
    tok = _tokens_bytes(tokens)
    extra = {"blocks": list(blocks), "block_tokens": block_tokens, "state_len": state_len} if blocks else {}
    hdr = json.dumps({
        **extra,
        "preview": preview,
        "model_sha256": model_sha256,
        "salt": salt,
        "model_name": model_name,
        "n_tokens": len(tokens),
        "payload_len": len(payload),
        "payload_crc32": zlib.crc32(payload),
        "tokens_sum": hashlib.blake2b(tok, digest_size=16).hexdigest(),
        "created": time.time(),
    }, sort_keys=True).encode()
    head = _FIXED.pack(MAGIC, FORMAT_VERSION, len(hdr), hashlib.blake2b(hdr, digest_size=16).digest()) + hdr + tok
    return head, payload


WRITE_CHUNK = 8 << 20


def write_file(path: Path, model_sha256: str, salt: dict, model_name: str, tokens: list[int], payload: bytes,
               preview: str = "", check=None, tmp_prefix: str | None = None, blocks: tuple[str, ...] = (),
               block_tokens: int = 0, state_len: int = 0) -> int:
    """Write a state file atomically (temporary name + rename); returns its size in bytes.

    ``check`` (optional) is called before every 8 MiB chunk; whatever it
    raises (the writer's abort) removes the temporary file and propagates.
    ``tmp_prefix``: the writer's temporary-name prefix
    (:func:`~ollapy.cache.tempfiles.writer_prefix`; a fresh one when None).
    """
    if not payload:
        raise CacheFileError("refusing to write an empty state")
    head, payload = encode(model_sha256, salt, model_name, tokens, payload, preview, blocks, block_tokens, state_len)

    def write(f) -> None:
        f.write(head)
        view = memoryview(payload)
        for i in range(0, len(view), WRITE_CHUNK):
            if check is not None:
                check()
            f.write(view[i:i + WRITE_CHUNK])

    write_atomically(path, write, prefix=tmp_prefix or writer_prefix(), suffix=SUFFIX)
    return len(head) + len(payload)


def read_header(path: Path, model_sha256: str | None = None, salt: dict | None = None) -> Header:
    """Read and check a file's header and token ids; raises CacheFileError (with ``ident``) or OSError (file gone)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        try:
            return _read_header(f, path, st, model_sha256, salt)
        except UnknownFormat:
            raise  # never condemned: no ident
        except CacheFileError as exc:
            exc.ident = (st.st_dev, st.st_ino)
            raise


def _read_header(f, path: Path, st: os.stat_result, model_sha256: str | None, salt: dict | None) -> Header:
    size = st.st_size
    if size == 0:
        raise CacheFileError("empty file")
    fixed = f.read(_FIXED.size)
    if len(fixed) < _FIXED.size:
        raise CacheFileError("truncated header")
    magic, version, hdr_len, hdr_sum = _FIXED.unpack(fixed)
    if magic != MAGIC:
        raise UnknownFormat("another magic")
    if version not in KNOWN_VERSIONS:
        raise UnknownFormat(f"unknown format version {version}")
    if hdr_len <= 0 or hdr_len > _MAX_HEADER:
        raise CacheFileError("bad header length")
    raw = f.read(hdr_len)
    if len(raw) < hdr_len:
        raise CacheFileError("truncated header")
    if hashlib.blake2b(raw, digest_size=16).digest() != hdr_sum:
        raise CacheFileError("header checksum mismatch")
    try:
        h = json.loads(raw)
        n_tokens = int(h["n_tokens"])
        payload_len = int(h["payload_len"])
        crc = int(h["payload_crc32"])
        file_model = str(h["model_sha256"])
        file_salt = dict(h["salt"])
        blocks = tuple(str(b) for b in h.get("blocks", ()))
        block_tokens = int(h.get("block_tokens", 0))
        state_len = int(h.get("state_len", payload_len))
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheFileError(f"bad header: {exc}") from None
    if model_sha256 is not None and file_model != model_sha256:
        raise CacheFileError(f"foreign model {file_model[:12]} (expected {model_sha256[:12]})")
    if salt is not None and file_salt != salt:
        raise CacheFileError(f"other KV settings {file_salt} (expected {salt})")
    if n_tokens <= 0 or payload_len <= 0:
        raise CacheFileError("zero-length tokens or payload")
    if blocks and (block_tokens <= 0 or len(blocks) * block_tokens > n_tokens):
        raise CacheFileError(f"{len(blocks)} blocks of {block_tokens} do not fit {n_tokens} tokens")
    offset = _FIXED.size + hdr_len + 4 * n_tokens
    if size != offset + payload_len:
        raise CacheFileError(f"size {size} != expected {offset + payload_len} (truncated or padded)")
    tok = f.read(4 * n_tokens)
    if len(tok) < 4 * n_tokens:
        raise CacheFileError("truncated tokens")
    if hashlib.blake2b(tok, digest_size=16).hexdigest() != h.get("tokens_sum"):
        raise CacheFileError("token ids checksum mismatch")
    a = array("i")
    a.frombytes(tok)
    return Header(path=path, model_sha256=file_model, salt=file_salt, model_name=str(h.get("model_name", "")),
                  tokens=a.tolist(), payload_len=payload_len, payload_crc32=crc, payload_offset=offset,
                  created=float(h.get("created", 0.0)), size=size, preview=str(h.get("preview", "")),
                  ident=(st.st_dev, st.st_ino), blocks=blocks, block_tokens=block_tokens, state_len=state_len)


def map_payload(hdr: Header) -> memoryview:
    """Map the payload of a checked header copy-on-write, WITHOUT verifying its checksum (see :class:`PayloadCheck`).

    Neither a checksum nor llama.cpp's restore copies it first: the returned
    writable memoryview goes straight to ``llama_state_seq_set_data``. A file
    replaced or deleted later (another process evicting it) keeps its mapped
    pages valid. Raises FileReplaced when ``hdr.path`` names another file than
    the one ``hdr`` was read from, CacheFileError (truncated) or OSError.
    """
    with open(hdr.path, "rb") as f:
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino) != hdr.ident:
            raise FileReplaced("rewritten since its header was read")
        if st.st_size < hdr.payload_offset + hdr.payload_len:
            exc = CacheFileError("truncated payload")
            exc.ident = hdr.ident
            raise exc
        view = map_view(f.fileno(), st.st_size)  # holds no descriptor once the file is closed (filemap)
    return view[hdr.payload_offset:hdr.payload_offset + hdr.payload_len]


def read_payload(hdr: Header) -> memoryview:
    """:func:`map_payload` and verify the checksum before returning; raises CacheFileError or OSError."""
    view = map_payload(hdr)
    if zlib.crc32(view) != hdr.payload_crc32:
        exc = CacheFileError("payload checksum mismatch")
        exc.ident = hdr.ident
        raise exc
    return view


class PayloadCheck:
    """The crc32 of a mapped payload, computed on its own thread while the caller restores from the same pages.

    ``zlib.crc32`` and the ctypes call into ``llama_state_seq_set_data`` both
    release the GIL, so checking and restoring overlap: a restore costs about
    the longer of the two instead of their sum (bench_cache.py's restore row).
    The caller must not trust what it restored until :meth:`ok` returns True;
    on False it clears what it restored and treats the file as corrupt.
    The thread is joined by :meth:`ok`; it holds no
    other resource.
    """

    def __init__(self, view: memoryview, expected_crc32: int) -> None:
        self._expected = expected_crc32
        self._crc: int | None = None
        self._thread = threading.Thread(target=self._run, args=(view,), name="ollapy-crc32", daemon=True)
        self._thread.start()

    def _run(self, view: memoryview) -> None:
        self._crc = zlib.crc32(view)

    def ok(self) -> bool:
        """Wait for the checksum; True when it matches the header's."""
        self._thread.join()
        return self._crc == self._expected


def quick_info(path: Path) -> dict | None:
    """Header fields without checking tokens or payload (for ``cache ls``); None when unreadable."""
    try:
        hdr = read_header(path)
    except (OSError, CacheFileError):
        return None
    return {"model_sha256": hdr.model_sha256, "model_name": hdr.model_name, "salt": hdr.salt,
            "n_tokens": len(hdr.tokens), "size": hdr.size, "created": hdr.created, "preview": hdr.preview,
            "blocks": list(hdr.blocks), "block_tokens": hdr.block_tokens, "state_len": hdr.state_len}
