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
    """The address of ``buf``'s first byte (any buffer: bytes, bytearray, a memoryview of an mmap)."""
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
    data: only the header, the cells' metadata (12 bytes a cell) and the per-layer type fields are written.
    """
    layout, segs, rest = _chain_segments(blocks, tail)
    n = layout.n_cells
    keep: list = [mv for mv, _ in segs]
    bases = np.array([_address(mv) for mv, _ in segs], dtype=np.uint64)
    cells = np.array([m for _, m in segs], dtype=np.uint64)
    read = np.zeros(len(segs), dtype=np.uint64)  # bytes consumed so far inside each segment
    ptrs: list[np.ndarray] = []
    sizes: list[np.ndarray] = []

    def small(data: bytes | bytearray) -> None:  # a piece this function writes
        if data:
            keep.append(data)
            ptrs.append(np.array([_address(data)], dtype=np.uint64))
            sizes.append(np.array([len(data)], dtype=np.uint64))

    head = bytearray(layout.header)
    head += _U32.pack(layout.n_stream)
    head += b"\0\0\0\0" * layout.stream  # the empty streams before the one with cells
    head += _U32.pack(n)
    meta = np.empty((n, 3), dtype="<i4")
    meta[:, 0] = np.arange(n, dtype=np.int32)
    meta[:, 1] = 1
    meta[:, 2] = layout.cell_seq
    head += meta.tobytes()
    head += struct.pack("<II", int(layout.v_trans), layout.n_layer)
    small(head)
    for t, row in zip(layout.k_types, layout.k_rows):
        small(struct.pack("<iQ", t, row))
        ptrs.append(bases + read)
        sizes.append(cells * np.uint64(row))
        read += cells * np.uint64(row)
    for t, row, el, embd in zip(layout.v_types, layout.v_rows, layout.v_elems, layout.n_embd_v):
        if layout.v_trans:  # element j's values of every cell: B*el bytes per block, block after block
            small(struct.pack("<iII", t, el, embd))
            width = cells * np.uint64(el)
            rows = np.arange(embd, dtype=np.uint64)[:, None]
            ptrs.append(((bases + read)[None, :] + rows * width[None, :]).ravel())
            sizes.append(np.broadcast_to(width, (embd, len(segs))).ravel())
        else:
            small(struct.pack("<iQ", t, row))
            ptrs.append(bases + read)
            sizes.append(cells * np.uint64(row))
        read += cells * np.uint64(row)
    small(b"\0\0\0\0" * (layout.n_stream - 1 - layout.stream))  # the empty streams after it
    if len(rest):
        keep.append(rest)
        ptrs.append(np.array([_address(rest)], dtype=np.uint64))
        sizes.append(np.array([len(rest)], dtype=np.uint64))
    p = np.concatenate(ptrs)
    s = np.ascontiguousarray(np.concatenate(sizes), dtype=np.uint64)
    total = int(s.sum())
    assert total == 8 + _cache_size(layout, n) + len(rest), "pieces do not add up to the joined state"
    return StateSegments(np.ascontiguousarray(p, dtype=np.uint64), s, total, keep, blocks, tail,
                         len(p) - 1 if len(rest) else -1)

