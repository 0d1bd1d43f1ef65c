"""A sliding-window cache's cells placed, on restore, where a cold run puts them (modulo the attention's lanes).

``llama_state_seq_get_data`` keeps only the in-window cells of a sliding-window (SWA) cache: positions
``[p_first, end)`` with ``p_first = end - n_swa`` once a sequence is longer than its window
(``llama_kv_cache::state_write`` skips the cells ``is_masked_swa`` hides). ``state_read`` then places them in
the destination stream from its head, cell 0 of an empty stream, so position ``p`` lands in cell
``p - p_first``. A cold run (ollapy's contexts set ``swa_full``: a window cache as large as the context, so
nothing wraps) holds position ``p`` in cell ``p``. ggml-cpu's attention sums over the KV cells in lanes by
cell index (``GGML_F16_STEP`` 64 in ``ggml_vec_dot_f16``; ``KN`` 16 in tinyBLAS; see
:data:`ollapy.engine.prefix.evalorder.SWA_ALIGN`), so the restored sums match the cold ones bit for bit only
when ``p_first`` is a multiple of 64: the reason sliding-window states used to be kept on a 64-token grid.

:func:`align_window` lifts that: it puts ``k = p_first mod grid`` empty cells in front of the window, at
positions ``p_first - k .. p_first - 1`` with zero K and V. They keep the sequence's positions contiguous (the
invariant ``apply_ubatch`` keeps), every later query masks them (they lie outside its window, as the cold
run's cells before ``p_first`` do), and a masked key adds an exact zero to every sum, so position ``p`` sits in
cell ``p - p_first + k``, which is ``p`` modulo ``grid``: the cold run's lane. ``tests/test_exact_logits.py``
holds restored states ending off the grid to the cold logits bit for bit.

The empty cells are not KV: :class:`~ollapy.engine.backend.context.Backend` remembers the first real position
of each sequence it restored so (``window_floor``), and a trim that would need the positions below it is
refused (:meth:`ollapy.engine.prefix.assignment.SlotAssigner.window_holed`).
"""
from __future__ import annotations

import copy
import ctypes
import struct
from dataclasses import dataclass, field

import numpy as np

from ollapy.kvformat import U32, CacheView, Unparsed, parse_cache

SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic

WINDOW_GRID = 64
"""The lane width the placement is kept to (:data:`ollapy.engine.prefix.evalorder.SWA_ALIGN`)."""


class WindowError(ValueError):
    """A sliding-window cache that cannot be placed: it does not parse, or its cells are not consecutive."""


def window_pad(rest: memoryview | bytes | bytearray, grid: int = WINDOW_GRID) -> int:
    """The empty cells :func:`align_window` puts in front of ``rest``'s window (0 when it starts on the grid or
    holds no cells). Raises WindowError when ``rest`` is not one llama.cpp KV cache of one sequence."""
    cache, first = _window(memoryview(rest).cast("B"))
    return 0 if cache is None else first % grid


def align_window(rest: memoryview | bytes | bytearray, grid: int = WINDOW_GRID) -> memoryview | bytes | bytearray:
    """``rest`` (one ``llama_kv_cache::state_write`` output: the sliding-window cache of a sequence state) with
    :func:`window_pad` empty cells before its first cell, so that a restore places every position in a cell
    congruent to it modulo ``grid`` (module docstring). Returns ``rest`` itself when nothing is to be added;
    otherwise a new bytearray of ``len(rest) + k * (12 + bytes per cell)`` bytes: :func:`window_pieces` joined,
    for a backend that reads one buffer. Raises WindowError when ``rest`` does not parse as one KV cache of one
    sequence, or its cells are not consecutive positions."""
    pieces = window_pieces(rest, grid)
    if pieces is None:
        return rest
    out = bytearray(int(pieces.sizes.sum()))
    dst, o = _addr(out), 0
    for p, n in zip(pieces.ptrs.tolist(), pieces.sizes.tolist()):
        ctypes.memmove(dst + o, p, n)
        o += n
    return out


def window_pieces(rest: memoryview | bytes | bytearray, grid: int = WINDOW_GRID) -> Pieces | None:
    """:func:`align_window`'s bytes as memory pieces, copying none of the cells: the header and the empty cells'
    metadata are written, the empty cells' K and V point at one zero buffer, and the window's data is read where
    ``rest`` holds it (which must outlive the pieces). None when nothing is to be added. Raises WindowError as
    :func:`align_window` does."""
    mv = memoryview(rest).cast("B")
    cache, first = _window(mv)
    k = 0 if cache is None else first % grid
    if k == 0:
        return None
    assert cache is not None and first >= k
    n_stream, stream, seq, v_trans, _, k_rows, _, v_rows, v_elems, n_embd_v = cache.shape
    c, base = cache.n_cells, _addr(mv)
    zeros = np.zeros(k * max(*k_rows, *v_rows), np.uint8)
    zero = int(zeros.ctypes.data)
    head = bytearray(U32.pack(n_stream) + b"\0\0\0\0" * stream + U32.pack(c + k))
    meta = np.empty((k, 3), dtype="<i4")
    meta[:, 0] = np.arange(first - k, first, dtype=np.int32)
    meta[:, 1] = 1
    meta[:, 2] = seq
    head += meta.tobytes()
    ptrs: list = [[_addr(head)]]
    sizes: list = [[len(head)]]
    i = 4 + 4 * (stream + 1)  # the window's cells, then v_trans and n_layer
    ptrs.append([base + i])
    sizes.append([12 * c + 8])
    i += 12 * c + 8
    for row in k_rows:  # per layer: type and row size, k zero rows, the window's rows
        ptrs.append([base + i, zero, base + i + 12])
        sizes.append([12, k * row, c * row])
        i += 12 + c * row
    for row, el, embd in zip(v_rows, v_elems, n_embd_v):
        if v_trans:  # per embedding element: k zero values, then the window's values
            p = np.empty(1 + 2 * embd, np.uint64)
            s = np.empty(1 + 2 * embd, np.uint64)
            p[0], s[0] = base + i, 12
            p[1::2], s[1::2] = zero, k * el
            p[2::2], s[2::2] = base + i + 12 + np.arange(embd, dtype=np.uint64) * (c * el), c * el
            ptrs.append(p)
            sizes.append(s)
        else:
            ptrs.append([base + i, zero, base + i + 12])
            sizes.append([12, k * row, c * row])
        i += 12 + c * row
    tail = len(mv) - i  # the empty streams after the window's
    assert tail == 4 * (n_stream - 1 - stream), (tail, n_stream, stream)
    if tail:
        ptrs.append([base + i])
        sizes.append([tail])
    return Pieces(np.concatenate([np.asarray(x, np.uint64) for x in ptrs]),
                  np.concatenate([np.asarray(x, np.uint64) for x in sizes]), [head, zeros, rest])


def _window(mv: memoryview) -> tuple[CacheView | None, int]:
    """``(parsed cache, first position)`` of ``mv``, or ``(None, 0)`` for a cache with no cells."""
    try:
        cache = parse_cache(mv, 0)
    except (Unparsed, struct.error, ValueError) as exc:
        raise WindowError(f"not a sliding-window KV cache: {exc}") from None
    if cache.end != len(mv):
        raise WindowError("a sliding-window KV cache with trailing bytes")
    if cache.n_cells == 0:
        return None, 0
    meta_off = 4 + 4 * (cache.shape[1] + 1)  # n_stream, then the counts of the streams up to the filled one
    pos = np.frombuffer(mv, dtype="<i4", count=3 * cache.n_cells, offset=meta_off)[0::3]
    first = int(pos[0])
    if not (pos == np.arange(first, first + cache.n_cells, dtype=np.int32)).all():
        raise WindowError("a sliding-window KV cache whose cells are not consecutive positions")
    return cache, first


@dataclass
class Pieces:
    """A state as memory pieces for ``llama_state_seq_set_data_segments``: uint64 ``ptrs``/``sizes`` of one
    shape ``(n,)``; ``keep`` owns the memory the pieces point into."""

    ptrs: np.ndarray
    sizes: np.ndarray
    keep: list = field(default_factory=list)


def _addr(buf) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


def place_state(data, segments: bool):
    """``(data to restore, first window position or 0)``: the state ``data`` with its sliding-window cache
    aligned by :func:`align_window`; ``data`` itself when it holds no such cache or nothing is to be added.

    ``data``: a state buffer, or an object with uint64 ``ptrs``/``sizes`` and ``rest_index`` (the piece holding
    the sliding-window cache, -1 for none: :class:`ollapy.cache.kvsegments.StateSegments`). ``segments``: the
    backend reads pieces, so a changed buffer comes back as :class:`Pieces` (the cells are not copied again);
    otherwise as one new bytearray. Raises WindowError as :func:`align_window` does.
    """
    if hasattr(data, "ptrs"):
        i = getattr(data, "rest_index", -1)
        if i < 0:
            return data, 0
        if i >= len(data.ptrs):
            raise WindowError(f"the sliding-window cache is piece {i} of {len(data.ptrs)}")
        size = int(data.sizes[i])
        rest = memoryview((ctypes.c_uint8 * size).from_address(int(data.ptrs[i]))).cast("B")
        first = _first_position(rest)
        placed = window_pieces(rest)
        if placed is None:
            return data, first
        out = copy.copy(data)
        out.ptrs = np.concatenate([data.ptrs[:i], placed.ptrs, data.ptrs[i + 1:]])
        out.sizes = np.concatenate([data.sizes[:i], placed.sizes, data.sizes[i + 1:]])
        out.keep = [*data.keep, placed.keep]
        out.nbytes = int(out.sizes.sum())
        return out, first
    mv = memoryview(data).cast("B")
    if len(mv) < 12 or U32.unpack_from(mv, 0)[0] != SEQ_MAGIC:
        return data, 0  # not a state this module reads: llama.cpp judges it
    try:
        base = parse_cache(mv, 8)
    except (Unparsed, struct.error, ValueError):
        return data, 0
    if base.end == len(mv):
        return data, 0  # one KV cache: no sliding window
    rest = mv[base.end:]
    first = _first_position(rest)
    if segments:
        pieces = window_pieces(rest)
        if pieces is None:
            return data, first
        return Pieces(np.concatenate([np.array([_addr(mv)], np.uint64), pieces.ptrs]),
                      np.concatenate([np.array([base.end], np.uint64), pieces.sizes]), [data, pieces.keep]), first
    placed = align_window(rest)
    if placed is rest:
        return data, first
    out = bytearray(base.end + len(placed))
    out[:base.end] = mv[:base.end]
    out[base.end:] = placed
    return out, first


def _first_position(rest: memoryview) -> int:
    return _window(rest)[1]
