"""Sequence states that restore into a context with any number of slots.

``llama_state_seq_get_data`` writes an 8-byte header (``u32`` magic
``0xaf143cd8`` and the source ``seq_id``; ``llama_context::state_seq_get_data``
in llama.cpp's ``src/llama-context.cpp``). On a non-unified KV cache (one
stream per sequence, as ollapy's contexts are) the memory state follows:
``u32 n_stream`` and then, for every stream, ``u32 cell_count`` followed by that
stream's cells (meta + data) when the count is not zero
(``llama_kv_cache::state_write`` in ``src/llama-kv-cache.cpp``). Only the sequence's own stream has cells. On
restore, ``state_read`` refuses a state whose ``n_stream`` differs from the
context's ("n_stream mismatch"), and places the non-empty stream's cells in the
destination sequence's stream whatever its index.

So a state saved by a 4-slot server would be refused by a 1-slot ``ollapy run``
and the other way round. :func:`to_portable` rewrites a state to the 1-stream
layout (``n_stream = 1`` plus the one non-empty block) and :func:`from_portable`
expands it to a context's stream count (the block first, then empty streams).
This holds only for a plain KV cache: sliding-window (two caches in one state)
and recurrent memories keep llama.cpp's layout and the stream count in the
cache salt instead.
"""
from __future__ import annotations

import struct

_U32 = struct.Struct("<I")
PORTABLE = "seq-portable-1"
MAGIC = 0xAF143CD8
HEAD = 8  # magic + source seq_id (the reader checks the magic and ignores the seq_id)


def to_portable(raw: bytearray, n_stream: int) -> bytearray | None:
    """Rewrite ``raw`` (a state of ``n_stream`` streams) in place to the 1-stream layout; None when it does not parse.

    Cheap: the empty streams after the block are cut off the end; those before
    it are removed by moving the 8-byte header forward and dropping the front
    of the bytearray (CPython moves its start, not the data).
    """
    if len(raw) < HEAD + 8 or _U32.unpack_from(raw, 0)[0] != MAGIC or _U32.unpack_from(raw, HEAD)[0] != n_stream:
        return None
    k = 0  # streams before the non-empty one (their cell_count is 0)
    while k < n_stream and _U32.unpack_from(raw, HEAD + 4 + 4 * k)[0] == 0:
        k += 1
    if k == n_stream:
        return None  # no cells at all
    tail = 4 * (n_stream - 1 - k)
    if tail and any(raw[len(raw) - tail:]):
        return None  # another stream holds cells: not a single-sequence state
    if tail:
        del raw[len(raw) - tail:]
    if k:
        raw[4 * k:4 * k + HEAD] = raw[0:HEAD]
        del raw[:4 * k]
    _U32.pack_into(raw, HEAD, 1)
    return raw


def from_portable(data, n_stream: int):
    """The state to hand ``llama_state_seq_set_data`` in a context of ``n_stream`` streams; None when not portable.

    With one stream the data is used as it is (no copy); otherwise the block is
    copied after the header and a ``n_stream`` count, and followed by empty streams.
    """
    if len(data) < HEAD + 8 or _U32.unpack_from(data, 0)[0] != MAGIC or _U32.unpack_from(data, HEAD)[0] != 1:
        return None
    if n_stream == 1:
        return data
    out = bytearray(len(data) + 4 * (n_stream - 1))
    view = memoryview(data)
    out[0:HEAD] = view[0:HEAD]
    _U32.pack_into(out, HEAD, n_stream)
    out[HEAD + 4:len(data)] = view[HEAD + 4:]
    return out


def from_portable_segments(ptrs, sizes, n_stream: int):
    """:func:`from_portable` for a state given as pieces (uint64 ``ptrs``/``sizes`` arrays, as
    :class:`ollapy.cache.kvsegments.StateSegments` holds them): ``(ptrs, sizes, keep)``, or None when not portable.

    The first piece must hold at least the header and the stream count (12 bytes). With one stream the pieces
    are used as they are; otherwise the first piece is copied with the count rewritten, and the empty streams
    are one more piece at the end. ``keep`` owns the memory of the pieces written here.
    """
    import ctypes

    import numpy as np

    if len(ptrs) == 0 or int(sizes[0]) < HEAD + 4:
        return None
    first = bytearray(ctypes.string_at(int(ptrs[0]), int(sizes[0])))
    if _U32.unpack_from(first, 0)[0] != MAGIC or _U32.unpack_from(first, HEAD)[0] != 1:
        return None
    if n_stream == 1:
        return ptrs, sizes, []
    _U32.pack_into(first, HEAD, n_stream)
    empty = bytearray(4 * (n_stream - 1))
    keep = [np.frombuffer(first, np.uint8), np.frombuffer(empty, np.uint8)]
    new_ptrs = np.concatenate([[keep[0].ctypes.data], ptrs[1:], [keep[1].ctypes.data]]).astype(np.uint64)
    new_sizes = np.concatenate([sizes[:1], sizes[1:], [len(empty)]]).astype(np.uint64)
    return new_ptrs, new_sizes, keep
