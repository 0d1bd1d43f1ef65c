"""A state kept as KV blocks, described as the ordered memory pieces that make its bytes, for a restore without a join.

:func:`ollapy.cache.kvstate.join_state` copies a chain of blocks and its tail into one buffer, because
``llama_state_seq_set_data`` reads a state from one buffer; llama.cpp then copies that buffer into its KV
tensors. ollapy's build of llama.cpp adds ``llama_state_seq_set_data_segments``
(scripts/patch_state_segments.py): the same read, from a list of ``(address, size)`` pieces in order. So
:func:`join_segments` only computes where each piece of the joined state lies (the small header fields it
writes itself; the cells' K and V data where the blocks and the tail hold them), and llama.cpp copies every
block's data into its tensors directly: one copy of the state instead of two.

The pieces, concatenated, are exactly the bytes :func:`~ollapy.cache.kvstate.join_state` returns (see that
module's docstring for the layout; tests/test_kvsegments.py holds them equal). A transposed V contributes one
piece per embedding element per block (``n_embd_v_gqa`` rows of ``B * elem`` bytes), computed with numpy.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ollapy.cache.kvstate import _cache_size, _chain_segments

_U32 = struct.Struct("<I")


def _address(buf) -> int:
    """The address of ``buf``'s first byte (any buffer: bytes, bytearray, a memoryview of an mmap).

    A writable buffer (a block's copy-on-write mapping) goes through ctypes, which costs less than making a
    numpy view; a read-only one (bytes) through numpy. The buffer export ends before this returns.
    """
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):  # read-only, or empty
        return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


@dataclass
class StateSegments:
    """A sequence state as ``len(ptrs)`` pieces in order: piece ``i`` is ``sizes[i]`` bytes at address ``ptrs[i]``.

    ``ptrs``/``sizes`` are uint64 arrays of one shape ``(n,)``; ``nbytes`` is their sum (the state's size).
    ``keep`` holds every object whose memory a piece points into: the pieces stay valid while this object
    lives. ``blocks``/``tail`` are what it was made from (:meth:`join` rebuilds one buffer from them).
    ``rest_index``: the one piece that holds the caches after the first (a sliding window's, which the backend
    places: :mod:`ollapy.engine.backend.window`), -1 when there are none.
    """

    ptrs: np.ndarray
    sizes: np.ndarray
    nbytes: int
    keep: list = field(default_factory=list)
    blocks: Sequence = ()
    tail: object = b""
    rest_index: int = -1

    def __len__(self) -> int:
        return self.nbytes

    def join(self) -> bytearray:
        """The state as one buffer (:func:`~ollapy.cache.kvstate.join_state`): for a build without the
        segments reader."""
        from ollapy.cache.kvstate import join_state

        return join_state(self.blocks, self.tail)

    def tobytes(self) -> bytes:
        """The pieces' bytes concatenated, read from where they lie (for checks; one ctypes read per piece)."""
        return b"".join(ctypes.string_at(int(p), int(s)) for p, s in zip(self.ptrs, self.sizes))


def join_segments(blocks: Sequence[bytes | bytearray | memoryview], tail: bytes | bytearray | memoryview) -> StateSegments:
    """The pieces of the state that ``blocks`` and ``tail`` join into, in the order llama.cpp reads it.

    Validates as :func:`~ollapy.cache.kvstate.join_into` does and raises KVStateError on the same input: a
    block count or size that does not match the tail, a truncated, corrupt or unknown tail. Copies no cell
    data: only the header, the cells' metadata (12 bytes a cell) and the per-layer type fields are written,
    into one buffer. The pieces of a layer group (every K layer; every V layer) are computed as one array.
    """
    layout, segs, rest = _chain_segments(blocks, tail)
    n, n_seg, n_layer = layout.n_cells, len(segs), layout.n_layer
    bases = np.fromiter((_address(mv) for mv, _ in segs), dtype=np.uint64, count=n_seg)
    cells = np.fromiter((m for _, m in segs), dtype=np.uint64, count=n_seg)

    # the fields this function writes, in one buffer: the header and cell metadata, then one 12-byte type field
    # per K layer and per V layer, then the empty streams after the one with cells
    meta = np.empty((n, 3), dtype="<i4")
    meta[:, 0] = np.arange(n, dtype=np.int32)
    meta[:, 1] = 1
    meta[:, 2] = layout.cell_seq
    head = b"".join((layout.header, _U32.pack(layout.n_stream), b"\0\0\0\0" * layout.stream, _U32.pack(n),
                     meta.tobytes(), struct.pack("<II", int(layout.v_trans), layout.n_layer)))
    k_fields = b"".join(struct.pack("<iQ", t, row) for t, row in zip(layout.k_types, layout.k_rows))
    if layout.v_trans:
        v_fields = b"".join(struct.pack("<iII", t, el, embd)
                            for t, el, embd in zip(layout.v_types, layout.v_elems, layout.n_embd_v))
    else:
        v_fields = b"".join(struct.pack("<iQ", t, row) for t, row in zip(layout.v_types, layout.v_rows))
    after = b"\0\0\0\0" * (layout.n_stream - 1 - layout.stream)
    fields = bytearray(b"".join((head, k_fields, v_fields, after)))
    f0 = _address(fields)
    k0, v0, a0 = len(head), len(head) + len(k_fields), len(head) + len(k_fields) + len(v_fields)

    # bytes per cell before each layer's rows inside a block (K layers, then V layers)
    rows = np.array(layout.k_rows + layout.v_rows, dtype=np.uint64)
    before = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.uint64)
    field = np.full((n_layer, 1), 12, dtype=np.uint64)
    k_ptr = np.hstack((f0 + k0 + 12 * np.arange(n_layer, dtype=np.uint64)[:, None],
                       bases[None, :] + cells[None, :] * before[:n_layer, None]))
    k_size = np.hstack((field, cells[None, :] * rows[:n_layer, None]))
    parts_p = [np.array([f0], dtype=np.uint64), k_ptr.ravel()]
    parts_s = [np.array([len(head)], dtype=np.uint64), k_size.ravel()]
    v_before = before[n_layer:]
    if layout.v_trans:  # element j's values of every cell: B*el bytes per block, block after block
        for i, (el, embd) in enumerate(zip(layout.v_elems, layout.n_embd_v)):
            width = cells * np.uint64(el)
            j = np.arange(embd, dtype=np.uint64)[:, None]
            parts_p += [np.array([f0 + v0 + 12 * i], dtype=np.uint64),
                        (bases[None, :] + cells[None, :] * v_before[i] + j * width[None, :]).ravel()]
            parts_s += [field[0], np.broadcast_to(width, (embd, n_seg)).ravel()]
    else:
        v_ptr = np.hstack((f0 + v0 + 12 * np.arange(n_layer, dtype=np.uint64)[:, None],
                           bases[None, :] + cells[None, :] * v_before[:, None]))
        parts_p.append(v_ptr.ravel())
        parts_s.append(np.hstack((field, cells[None, :] * rows[n_layer:, None])).ravel())
    if after:
        parts_p.append(np.array([f0 + a0], dtype=np.uint64))
        parts_s.append(np.array([len(after)], dtype=np.uint64))
    keep: list = [mv for mv, _ in segs] + [fields]
    if len(rest):
        keep.append(rest)
        parts_p.append(np.array([_address(rest)], dtype=np.uint64))
        parts_s.append(np.array([len(rest)], dtype=np.uint64))
    p = np.ascontiguousarray(np.concatenate(parts_p), dtype=np.uint64)
    sz = np.ascontiguousarray(np.concatenate(parts_s), dtype=np.uint64)
    total = int(sz.sum())
    assert total == 8 + _cache_size(layout, n) + len(rest), "pieces do not add up to the joined state"
    return StateSegments(p, sz, total, keep, blocks, tail, len(p) - 1 if len(rest) else -1)
