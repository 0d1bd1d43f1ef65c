"""The remote tier's keys and values: KV blocks and entries as self-describing values in Valkey/Redis.

Keys (one value each; no key lists another key, so Valkey Cluster needs no cross-slot command)::

    <namespace>:ollapy:r<REMOTE_FORMAT>:b:<block name>[:<part>]   a KV block (:mod:`ollapy.cache.blocks`)
    <namespace>:ollapy:r<REMOTE_FORMAT>:e:<anchor>[:<part>]       an entry: its token ids, block chain and tail

A block's name is its chain hash (:meth:`ollapy.cache.index.BlockIndex.chain`, seeded with the model
file's sha256 and the KV salt, tenant included); an entry's *anchor* is the chain hash of its last full
index block (64 tokens), so a prompt's anchors are computed without a look-up and the longest stored entry
of a prompt is found with one pipelined ``EXISTS`` (:mod:`ollapy.cache.remote_tier`). Part 0 has no suffix;
a payload over :data:`PART_BYTES` continues under ``:1``, ``:2``... (Valkey's throughput falls off past
about 4 MiB a value), each part a value of its own with its own header.

Value layout (little endian), like the disk tier's state file (:mod:`ollapy.cache.fileformat`)::

    magic      8 bytes   b"OLLAPYRV"
    version    u32       REMOTE_FORMAT
    hdr_len    u32       length of the JSON header
    hdr_sum    16 bytes  blake2b-128 of the JSON header
    header     JSON      kind ("block"/"entry"), key, part, n_parts, model_sha256, salt, payload_len,
                         payload_crc32c; a block adds tokens (its B token ids) and parent (the previous
                         block's name, "" for the first); an entry adds tokens (all of them), blocks,
                         block_tokens, state_len, block_len (bytes of each block), block_parts
    payload    payload_len bytes (this part's bytes of the block, or of the entry's tail)

A reader trusts nothing the key says: :func:`decode` checks magic, version, the header's checksum, kind,
key, part, model and salt, the length and the payload's CRC-32C, and raises :class:`RemoteValueError` (a
counted miss, never retried) on any mismatch, a truncation or garbage. The value layout follows
LMCache's one-key-per-chunk remote backends (Redis/Valkey connectors).

The payload checksum is CRC-32C (Castagnoli, RFC 3720's iSCSI polynomial) from the ``crc32c`` package (part of
``ollapy[remote]``), which uses the CPU's CRC instructions (SSE 4.2, ARMv8) at many GB/s and releases the GIL:
a restore checks every byte it reads while the store's reader thread receives the next values. Format 1 used
zlib's crc32 (about 1 GB/s, a third of a restore's time); its values live under ``r1`` keys this build never reads.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

try:
    from crc32c import crc32c as _crc32c
except ImportError:  # the remote tier is then refused at open (ollapy.cache.remote names the extra)
    _crc32c = None

MAGIC = b"OLLAPYRV"
REMOTE_FORMAT = 2  # 2: the payload's checksum is CRC-32C (1: zlib's crc32)
PART_BYTES = 4 << 20  # the most payload bytes one value carries
_FIXED = struct.Struct("<8sII16s")
_MAX_HEADER = 4 << 20  # an entry's header lists its token ids: 4 MiB holds well over 200k of them

__all__ = ["MAGIC", "PART_BYTES", "REMOTE_FORMAT", "RemoteValueError", "ValueHeader", "block_key", "checksum",
           "decode", "encode_parts", "entry_key", "n_parts", "part_key"]


def checksum(data) -> int:
    """CRC-32C of the bytes of ``data`` (any buffer): the payload checksum of a value, an unsigned 32-bit int.
    Raises ImportError when the ``crc32c`` package is missing."""
    if _crc32c is None:
        raise ImportError("the remote tier needs the crc32c package: pip install 'ollapy[remote]'")
    return _crc32c(data)


class RemoteValueError(ValueError):
    """A value failed a check (another format, truncated, garbage, another model or key); ``str`` says which."""


@dataclass
class ValueHeader:
    """A checked value header: ``kind`` "block" or "entry", ``meta`` the kind's own fields (tokens, blocks...)."""

    kind: str
    key: str
    part: int
    n_parts: int
    payload_len: int
    meta: dict = field(default_factory=dict)


def key_prefix(namespace: str, version: int | None = None) -> str:
    """Every key's prefix: ``<namespace>:ollapy:r<version>`` (default: this build's :data:`REMOTE_FORMAT`)."""
    return f"{namespace}:ollapy:r{REMOTE_FORMAT if version is None else version}"


def block_key(namespace: str, name: str, version: int | None = None) -> str:
    """Part 0's key of block ``name`` (a chain hash, hex)."""
    return f"{key_prefix(namespace, version)}:b:{name}"


def entry_key(namespace: str, anchor: str, version: int | None = None) -> str:
    """Part 0's key of the entry anchored at chain hash ``anchor`` (hex)."""
    return f"{key_prefix(namespace, version)}:e:{anchor}"


def part_key(key: str, part: int) -> str:
    """The key of part ``part`` of the value whose part 0 is ``key``."""
    return key if part == 0 else f"{key}:{part}"


def n_parts(nbytes: int, part_bytes: int = PART_BYTES) -> int:
    """How many values a payload of ``nbytes`` takes (at least one)."""
    return max(1, -(-nbytes // part_bytes))


def encode_parts(kind: str, key: str, model_sha256: str, salt: dict, payload, meta: dict,
                 part_bytes: int = PART_BYTES) -> list[tuple[str, list]]:
    """``[(key of part i, [header bytes, payload slice])...]``: the values that store ``payload`` under ``key``.

    ``meta``: the kind's fields (JSON-able). The payload slices are views (no copy); a client sends the
    pieces of one value joined or as a scatter list.
    """
    view = memoryview(payload).cast("B")
    count = n_parts(len(view), part_bytes)
    out = []
    for i in range(count):
        piece = view[i * part_bytes:(i + 1) * part_bytes]
        hdr = json.dumps({**meta, "kind": kind, "key": key, "part": i, "n_parts": count,
                          "model_sha256": model_sha256, "salt": salt, "payload_len": len(piece),
                          "payload_crc32c": checksum(piece)}, sort_keys=True).encode()
        head = _FIXED.pack(MAGIC, REMOTE_FORMAT, len(hdr), hashlib.blake2b(hdr, digest_size=16).digest()) + hdr
        out.append((part_key(key, i), [head, piece]))
    return out


def decode(raw, kind: str, key: str, part: int, model_sha256: str, salt: dict) -> tuple[ValueHeader, memoryview]:
    """Check value ``raw`` read from part ``part`` of ``key``: ``(header, payload view)``.

    Raises :class:`RemoteValueError` when anything does not match what the reader expects (it trusts only
    its own model sha256, salt and key, never the value's claims).
    """
    if raw is None:
        raise RemoteValueError("missing")
    mv = memoryview(raw).cast("B")
    if len(mv) < _FIXED.size:
        raise RemoteValueError("truncated header")
    magic, version, hdr_len, hdr_sum = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise RemoteValueError("another magic")
    if version != REMOTE_FORMAT:
        raise RemoteValueError(f"format version {version} (this build reads {REMOTE_FORMAT})")
    if hdr_len <= 0 or hdr_len > _MAX_HEADER or len(mv) < _FIXED.size + hdr_len:
        raise RemoteValueError("truncated or bad header length")
    raw_hdr = mv[_FIXED.size:_FIXED.size + hdr_len]
    if hashlib.blake2b(raw_hdr, digest_size=16).digest() != hdr_sum:
        raise RemoteValueError("header checksum mismatch")
    try:
        h = json.loads(bytes(raw_hdr))
        got = ValueHeader(str(h.pop("kind")), str(h.pop("key")), int(h.pop("part")), int(h.pop("n_parts")),
                          int(h.pop("payload_len")))
        crc = int(h.pop("payload_crc32c"))
        model, vsalt = str(h.pop("model_sha256")), h.pop("salt")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RemoteValueError(f"bad header: {exc}") from None
    if got.kind != kind or got.key != key or got.part != part or not 0 <= part < got.n_parts:
        raise RemoteValueError(f"a {got.kind} value of {got.key} part {got.part}, expected {kind} {key} part {part}")
    if model != model_sha256:
        raise RemoteValueError(f"foreign model {model[:12]}")
    if vsalt != salt:
        raise RemoteValueError("other KV settings")
    payload = mv[_FIXED.size + hdr_len:]
    if len(payload) != got.payload_len:
        raise RemoteValueError(f"payload {len(payload)} bytes != {got.payload_len} (truncated or padded)")
    if checksum(payload) != crc:
        raise RemoteValueError("payload checksum mismatch")
    got.meta = h
    return got, payload
