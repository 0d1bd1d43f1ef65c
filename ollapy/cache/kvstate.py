"""llama.cpp sequence states cut into KV blocks of ``B`` positions, and joined back bit for bit.

The byte layout is the one ``llama_state_seq_get_data(ctx, dst, size, seq_id)`` writes (flags 0) in the
llama.cpp that llama-cpp-python 0.3.36 vendors (``src/llama-context.cpp``: ``state_seq_get_data``;
``src/llama-kv-cache.cpp``: ``llama_kv_cache::state_write``, ``state_write_meta``, ``state_write_data``;
``src/llama-kv-cache-iswa.cpp``: a base cache then a sliding-window cache), all little-endian::

    u32 magic 0xaf143cd8, i32 source seq_id
    per KV cache (one; two for iSWA models such as Gemma 3: the full-attention base cache, then the SWA one):
      u32 n_stream
      per stream: u32 cell_count; when not 0:
        per cell: i32 pos, u32 n_seq_id (1 for a sequence save), i32 seq_id
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_bytes, cell_count K rows
        per layer, V not transposed: i32 v_type, u64 v_row_bytes, cell_count V rows
        per layer, V transposed:     i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa,
                                     per embedding element j: the cells' values (cell_count * v_elem_bytes)

(Cells written for M-RoPE or PLE models carry 12 more bytes each; those layouts do not parse here.) The
*blockable part* is the first cache's one non-empty stream, and only when its cells are positions
``0..n-1`` of one sequence, in order: what a slot's prompt prefix is. Everything else (the header, empty
streams, the cells after the last full block, a sliding-window cache's in-window cells) goes in the *tail*,
which describes itself. Block ``i`` holds cells ``[i*B, (i+1)*B)``: per layer their K rows, then per layer
their V rows, or for a transposed V the ``n_embd_v_gqa x B`` sub-matrix of element values, row by row. A
block holds no sequence id and no stream index, so one saved from any slot serves every slot.

Anything this module does not recognise (another magic, a recurrent or hybrid memory, holes, shifted
positions, several sequences, trailing bytes, a truncation) makes :func:`split_state` return None: the
caller keeps such a state whole. The design follows vLLM's block-granular prefix caching and LMCache's
per-chunk KV storage; the byte format is llama.cpp's.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ollapy.kvformat import CacheView as _Cache
from ollapy.kvformat import Unparsed as _Unparsed
from ollapy.kvformat import parse_cache as _parse_cache

SEQ_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic
TAIL_MAGIC = b"OKVT"
TAIL_VERSION = 1
BLOCK_LAYOUT = 1  # the byte order inside a block (module docstring); a pool keeps blocks of another one apart

_U32 = struct.Struct("<I")
_TAIL_HEAD = struct.Struct("<4sHHII")  # magic, version, reserved, descriptor bytes, crc32 of the descriptor
_DESC = struct.Struct("<8sIIIIiIIQQ")  # header, n_stream, stream, n_cells, B, cell seq, v_trans, n_layer, partial, rest
_DESC_LAYER = struct.Struct("<iQiQII")  # k_type, k_row, v_type, v_row (bytes per cell), v_elem, n_embd_v


class KVStateError(ValueError):
    """Blocks and a tail that do not make a state: wrong block count or size, a truncated or unknown tail."""


@dataclass(frozen=True)
class KVLayout:
    """What a state's bytes look like, parsed once per state.

    ``k_rows``/``v_rows`` are bytes per cell per layer of the blockable (first) cache; for a transposed V,
    ``v_rows[l] == v_elems[l] * n_embd_v[l]``. ``n_parts`` is 1 for a plain KV cache, 2 for iSWA (base +
    sliding window); ``rest_len`` is the byte length of the caches after the first (kept whole in the tail).
    """

    header: bytes  # the 8-byte state header (magic, source seq_id), kept as written
    n_stream: int
    stream: int  # the first cache's non-empty stream
    n_cells: int
    cell_seq: int  # the seq_id every cell names
    v_trans: bool
    k_types: tuple[int, ...]
    k_rows: tuple[int, ...]
    v_types: tuple[int, ...]
    v_rows: tuple[int, ...]
    v_elems: tuple[int, ...]  # element bytes of a transposed V, 0 otherwise
    n_embd_v: tuple[int, ...]  # n_embd_v_gqa of a transposed V, 0 otherwise
    n_parts: int
    rest_len: int
    bytes_per_cell: int  # KV bytes of one cell in the blockable (full-attention) part

    @property
    def n_layer(self) -> int:
        return len(self.k_types)

    def block_bytes(self, n_cells: int) -> int:
        """Bytes of a block (or the tail's partial block) of ``n_cells`` cells."""
        return n_cells * self.bytes_per_cell


@dataclass(frozen=True)
class SplitState:
    """A state cut into full blocks of ``block_tokens`` cells plus a self-describing tail (:func:`split_state`)."""

    blocks: list[bytes]  # block i = cells [i*B, (i+1)*B) of the blockable part, in position order
    tail: bytes  # header, layout, the cells after the last full block, and the later caches whole
    n_cells: int  # cells in the blockable part
    layout: KVLayout


def _parse(state) -> tuple[memoryview, _Cache, _Cache | None]:
    mv = memoryview(state).cast("B")
    if len(mv) < 16 or _U32.unpack_from(mv, 0)[0] != SEQ_MAGIC:
        raise _Unparsed("magic")
    base = _parse_cache(mv, 8)
    rest = None
    if base.end != len(mv):
        rest = _parse_cache(mv, base.end)
        if rest.end != len(mv):
            raise _Unparsed("trailing bytes")
    return mv, base, rest


def _cell_bytes(shape) -> int:
    return sum(shape[5]) + sum(shape[7])


def _gather(mv: memoryview, cache: _Cache, a: int, m: int, trans_v: list) -> list:
    """The pieces of cells ``[a, a+m)`` in block order (K rows per layer, then V per layer)."""
    shape = cache.shape
    out = [mv[o + a * row:o + (a + m) * row] for o, row in zip(cache.k_offs, shape[5])]
    if shape[3]:
        for t, el in zip(trans_v, shape[8]):  # t: (n_embd, n * el) array of the layer's V
            out.append(np.ascontiguousarray(t[:, a * el:(a + m) * el]).data)
    else:
        out.extend(mv[o + a * row:o + (a + m) * row] for o, row in zip(cache.v_offs, shape[7]))
    return out


def _trans_views(mv: memoryview, cache: _Cache) -> list:
    shape, n = cache.shape, cache.n_cells
    if not shape[3]:
        return []
    return [np.frombuffer(mv, np.uint8, count=embd * n * el, offset=o).reshape(embd, n * el)
            for o, el, embd in zip(cache.v_offs, shape[8], shape[9])]


def _layout(mv: memoryview, base: _Cache, rest: _Cache | None) -> KVLayout:
    s = base.shape
    return KVLayout(bytes(mv[0:8]), s[0], s[1], base.n_cells, s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9],
                    1 if rest is None else 2, 0 if rest is None else rest.end - base.end, _cell_bytes(s))


def _parsed_layout(state: bytes | bytearray | memoryview) -> tuple[memoryview, _Cache, KVLayout] | None:
    """``(view of state, its blockable cache, layout)`` of a state this module splits (cells from position 0),
    else None."""
    try:
        mv, base, rest = _parse(state)
    except (_Unparsed, struct.error, ValueError):
        return None
    if base.n_cells == 0 or not base.from_zero:
        return None
    return mv, base, _layout(mv, base, rest)


def parse_layout(state: bytes | bytearray | memoryview) -> KVLayout | None:
    """The layout of ``state`` (see the module docstring), or None when it is not one this module splits."""
    parsed = _parsed_layout(state)
    return parsed[2] if parsed else None


def split_state(state: bytes | bytearray | memoryview, block_tokens: int) -> SplitState | None:
    """Cut ``state`` into full blocks of ``block_tokens`` cells and a tail; None for a layout not recognised.

    ``join_state(s.blocks, s.tail)`` gives ``state`` back byte for byte. Costs one copy of the state's bytes
    (1.5 copies of a transposed V). Raises ValueError when ``block_tokens`` < 1.
    """
    if block_tokens < 1:
        raise ValueError("block_tokens must be at least 1")
    parsed = _parsed_layout(state)
    if parsed is None:
        return None
    mv, base, layout = parsed
    n, b = base.n_cells, block_tokens
    n_blocks = n // b
    trans = _trans_views(mv, base)
    blocks = [b"".join(_gather(mv, base, i * b, b, trans)) for i in range(n_blocks)]
    partial = _gather(mv, base, n_blocks * b, n - n_blocks * b, trans) if n % b else []
    tail = _encode_tail(layout, b, partial, mv[base.end:])
    return SplitState(blocks, tail, n, layout)


def _encode_tail(layout: KVLayout, b: int, partial: list, rest: memoryview) -> bytes:
    partial_len = sum(len(memoryview(p).cast("B")) for p in partial)
    desc = [_DESC.pack(layout.header, layout.n_stream, layout.stream, layout.n_cells, b, layout.cell_seq,
                       int(layout.v_trans), layout.n_layer, partial_len, len(rest))]
    desc.extend(_DESC_LAYER.pack(*f) for f in zip(layout.k_types, layout.k_rows, layout.v_types, layout.v_rows,
                                                   layout.v_elems, layout.n_embd_v))
    d = b"".join(desc)
    return b"".join([_TAIL_HEAD.pack(TAIL_MAGIC, TAIL_VERSION, 0, len(d), zlib.crc32(d)), d, *partial, rest])


def _decode_tail(tail) -> tuple[KVLayout, int, memoryview, memoryview]:
    """(layout, block_tokens, partial-block bytes, later caches' bytes) of a tail; KVStateError when it is not one."""
    mv = memoryview(tail).cast("B")
    if len(mv) < _TAIL_HEAD.size + _DESC.size:
        raise KVStateError("KV state tail is truncated")
    magic, version, _, d_len, crc = _TAIL_HEAD.unpack_from(mv, 0)
    if magic != TAIL_MAGIC or version != TAIL_VERSION:
        raise KVStateError(f"not a KV state tail of version {TAIL_VERSION}")
    d0 = _TAIL_HEAD.size
    if len(mv) < d0 + d_len or zlib.crc32(mv[d0:d0 + d_len]) != crc:
        raise KVStateError("KV state tail descriptor is truncated or corrupt")
    header, n_stream, stream, n_cells, b, seq, v_trans, n_layer, p_len, r_len = _DESC.unpack_from(mv, d0)
    if d_len != _DESC.size + n_layer * _DESC_LAYER.size or not (b >= 1 and stream < n_stream and n_cells >= 1):
        raise KVStateError("KV state tail descriptor is inconsistent")
    layers = [_DESC_LAYER.unpack_from(mv, d0 + _DESC.size + i * _DESC_LAYER.size) for i in range(n_layer)]
    kt, kr, vt, vr, ve, vn = (tuple(x) for x in zip(*layers))
    layout = KVLayout(header, n_stream, stream, n_cells, seq, bool(v_trans), kt, kr, vt, vr, ve, vn,
                      1 if r_len == 0 else 2, r_len, sum(kr) + sum(vr))
    p0 = d0 + d_len
    if p_len != layout.block_bytes(n_cells % b) or len(mv) != p0 + p_len + r_len:
        raise KVStateError(f"KV state tail holds {len(mv) - p0} bytes of cells, its descriptor says {p_len + r_len}")
    return layout, b, mv[p0:p0 + p_len], mv[p0 + p_len:]


def _cache_size(layout: KVLayout, n: int) -> int:
    v_head = 12
    return (4 + 4 * layout.n_stream + 12 * n + 8 + layout.n_layer * (12 + v_head) + n * layout.bytes_per_cell)


def _emit_cache(out, off: int, layout: KVLayout, n: int, segments: list[tuple[memoryview, int]]) -> int:
    """Write a cache of ``n`` cells (positions 0..n-1) at ``off`` from ``segments`` ((block-order bytes, cells),
    in position order, together ``n`` cells); return the end offset."""
    _U32.pack_into(out, off, layout.n_stream)
    off += 4
    for s in range(layout.n_stream):
        _U32.pack_into(out, off, n if s == layout.stream else 0)
        off += 4
        if s != layout.stream:
            continue
        meta = np.frombuffer(out, dtype="<i4", count=3 * n, offset=off).reshape(n, 3)
        meta[:, 0] = np.arange(n, dtype=np.int32)
        meta[:, 1] = 1
        meta[:, 2] = layout.cell_seq
        off += 12 * n
        struct.pack_into("<II", out, off, int(layout.v_trans), layout.n_layer)
        off += 8
        seg_offs = [0] * len(segments)  # read position inside each segment, advanced layer by layer
        for t, row in zip(layout.k_types, layout.k_rows):
            struct.pack_into("<iQ", out, off, t, row)
            off += 12
            for i, (seg, m) in enumerate(segments):
                out[off:off + m * row] = seg[seg_offs[i]:seg_offs[i] + m * row]
                off += m * row
                seg_offs[i] += m * row
        for t, row, el, embd in zip(layout.v_types, layout.v_rows, layout.v_elems, layout.n_embd_v):
            if layout.v_trans:
                struct.pack_into("<iII", out, off, t, el, embd)
                off += 12
                dst = np.frombuffer(out, np.uint8, count=embd * n * el, offset=off).reshape(embd, n * el)
                a = 0
                for i, (seg, m) in enumerate(segments):
                    src = np.frombuffer(seg, np.uint8, count=m * row, offset=seg_offs[i]).reshape(embd, m * el)
                    dst[:, a * el:(a + m) * el] = src
                    a += m
                    seg_offs[i] += m * row
                off += n * row
            else:
                struct.pack_into("<iQ", out, off, t, row)
                off += 12
                for i, (seg, m) in enumerate(segments):
                    out[off:off + m * row] = seg[seg_offs[i]:seg_offs[i] + m * row]
                    seg_offs[i] += m * row
                    off += m * row
    return off


def _segments(blocks: Sequence, n_blocks: int, b: int, layout: KVLayout) -> list[tuple[memoryview, int]]:
    if len(blocks) < n_blocks:
        raise KVStateError(f"{len(blocks)} KV blocks given, {n_blocks} needed")
    size = layout.block_bytes(b)
    segs = []
    for i in range(n_blocks):
        mv = memoryview(blocks[i]).cast("B")
        if len(mv) != size:
            raise KVStateError(f"KV block {i} holds {len(mv)} bytes, {size} expected")
        segs.append((mv, b))
    return segs


def _chain_segments(blocks: Sequence, tail) -> tuple[KVLayout, list[tuple[memoryview, int]], memoryview]:
    """``(layout, pieces, rest)`` of the state that ``blocks`` and ``tail`` join into: ``pieces`` are
    ``(cells' bytes, cell count)`` in position order (the blocks, then the tail's partial block), ``rest`` the bytes
    after the first cache. Raises KVStateError when the block count or a block's size does not match the tail."""
    layout, b, partial, rest = _decode_tail(tail)
    n_blocks = layout.n_cells // b
    if len(blocks) != n_blocks:
        raise KVStateError(f"{len(blocks)} KV blocks given, the tail needs {n_blocks}")
    segs = _segments(blocks, n_blocks, b, layout)
    if layout.n_cells % b:
        segs.append((partial, layout.n_cells % b))
    return layout, segs, rest


def joined_size(tail: bytes | bytearray | memoryview) -> int:
    """Bytes of the state that ``tail`` and its blocks join into. Raises KVStateError for a tail that is not one."""
    layout, _, _, rest = _decode_tail(tail)
    return 8 + _cache_size(layout, layout.n_cells) + len(rest)


def join_into(blocks: Sequence[bytes | bytearray | memoryview], tail: bytes | bytearray | memoryview, out) -> int:
    """Write the state of ``blocks`` and ``tail`` into the writable buffer ``out`` (at least :func:`joined_size`
    bytes, e.g. a buffer reused from restore to restore, whose pages are already mapped); return its size.

    Raises KVStateError as :func:`join_state` does, and when ``out`` is too small.
    """
    layout, segs, rest = _chain_segments(blocks, tail)
    size = 8 + _cache_size(layout, layout.n_cells) + len(rest)
    out = memoryview(out).cast("B")
    if len(out) < size:
        raise KVStateError(f"a buffer of {len(out)} bytes cannot hold a state of {size}")
    out[0:8] = layout.header
    off = _emit_cache(out, 8, layout, layout.n_cells, segs)
    out[off:size] = rest
    return size


def join_state(blocks: Sequence[bytes | bytearray | memoryview], tail: bytes | bytearray | memoryview) -> bytearray:
    """The state :func:`split_state` cut into ``blocks`` and ``tail``, byte for byte, as one new bytearray.

    One allocation sized up front; the blocks are gathered into it with slice copies (a transposed V with
    numpy): about one memory copy of the state. Raises KVStateError on inconsistent input: a block count or
    size that does not match the tail, a truncated, corrupt or unknown tail.
    """
    out = bytearray(joined_size(tail))
    join_into(blocks, tail, out)
    return out


def prefix_state(blocks: Sequence[bytes | bytearray | memoryview], tail: bytes | bytearray | memoryview,
                 n_blocks: int) -> bytearray | None:
    """The state of only the first ``n_blocks`` blocks (positions ``[0, n_blocks*B)``), with no tail cells.

    ``blocks`` needs at least those ``n_blocks``. None where that is not a valid state: ``n_blocks`` < 1 or
    beyond the entry's full blocks, or a later cache (a sliding window) that does not hold every position from
    0 on; when it does (a sequence shorter than the window), it is cut to the same positions. Raises
    KVStateError as :func:`join_state` does.
    """
    layout, b, _, rest = _decode_tail(tail)
    if n_blocks < 1 or n_blocks > layout.n_cells // b:
        return None
    segs = _segments(blocks, n_blocks, b, layout)
    n = n_blocks * b
    rest_bytes: bytes | bytearray = b""
    if len(rest):
        rest_bytes = _cut_cache(rest, n, layout.n_cells)
        if rest_bytes is None:
            return None
    out = bytearray(8 + _cache_size(layout, n) + len(rest_bytes))
    out[0:8] = layout.header
    off = _emit_cache(out, 8, layout, n, segs)
    out[off:] = rest_bytes
    return out


def _cut_cache(rest: memoryview, n: int, n_total: int) -> bytearray | None:
    """A later cache (``rest``, one cache exactly) cut to positions 0..n-1; None unless it holds exactly the
    positions 0..n_total-1 of one sequence."""
    try:
        cache = _parse_cache(rest, 0)
    except (_Unparsed, struct.error, ValueError):
        return None
    if cache.end != len(rest) or cache.n_cells != n_total or not cache.from_zero:
        return None
    s = cache.shape
    lay = KVLayout(b"", s[0], s[1], n_total, s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], 1, 0, _cell_bytes(s))
    seg = memoryview(b"".join(_gather(rest, cache, 0, n, _trans_views(rest, cache))))
    out = bytearray(_cache_size(lay, n))
    _emit_cache(out, 0, lay, n, [(seg, n)])
    return out


def join_segments(blocks: Sequence[bytes | bytearray | memoryview], tail: bytes | bytearray | memoryview):
    """The state of ``blocks`` and ``tail`` as memory pieces, for a restore without a join
    (:func:`ollapy.cache.kvsegments.join_segments`; raises KVStateError as :func:`join_state` does)."""
    from ollapy.cache.kvsegments import join_segments as pieces

    return pieces(blocks, tail)


class StateAssembler:
    """Join a state block by block, each as it arrives, into a writable buffer ``out`` (at least :attr:`size`
    bytes): the result is :func:`join_into`'s, byte for byte, without holding the blocks until the last one.

    ``tail``: the chain's tail (:func:`split_state`); the header, the cells' metadata, the tail's partial block
    and the later caches are written at construction, each :meth:`put` writes one block's cells into its
    place (one copy; a transposed V by numpy row slices). Raises KVStateError for a tail that is not one, a
    buffer too small, a block of the wrong size or index. The remote tier restores through it while the next
    blocks are still being received (:mod:`ollapy.cache.remote_tier`).
    """

    def __init__(self, tail: bytes | bytearray | memoryview, out) -> None:
        layout, b, partial, rest = _decode_tail(tail)
        n = layout.n_cells
        self.b, self.n_blocks, self.n_cells = b, n // b, n
        self.block_size = layout.block_bytes(b)
        self.size = 8 + _cache_size(layout, n) + len(rest)
        mv = memoryview(out).cast("B")
        if len(mv) < self.size:
            raise KVStateError(f"a buffer of {len(mv)} bytes cannot hold a state of {self.size}")
        self.out = mv
        mv[0:8] = layout.header
        off = 8
        _U32.pack_into(mv, off, layout.n_stream)
        off += 4
        self._k: list[tuple[int, int]] = []  # (offset of a K layer's cells, bytes per cell)
        self._v: list[tuple[int, int, int, int]] = []  # (offset, bytes per cell, element bytes, rows); rows 0: not transposed
        for s in range(layout.n_stream):
            _U32.pack_into(mv, off, n if s == layout.stream else 0)
            off += 4
            if s != layout.stream:
                continue
            meta = np.frombuffer(mv, dtype="<i4", count=3 * n, offset=off).reshape(n, 3)
            meta[:, 0] = np.arange(n, dtype=np.int32)
            meta[:, 1] = 1
            meta[:, 2] = layout.cell_seq
            off += 12 * n
            struct.pack_into("<II", mv, off, int(layout.v_trans), layout.n_layer)
            off += 8
            for t, row in zip(layout.k_types, layout.k_rows):
                struct.pack_into("<iQ", mv, off, t, row)
                off += 12
                self._k.append((off, row))
                off += n * row
            for t, row, el, embd in zip(layout.v_types, layout.v_rows, layout.v_elems, layout.n_embd_v):
                if layout.v_trans:
                    struct.pack_into("<iII", mv, off, t, el, embd)
                    off += 12
                    self._v.append((off, row, el, embd))
                else:
                    struct.pack_into("<iQ", mv, off, t, row)
                    off += 12
                    self._v.append((off, row, 0, 0))
                off += n * row
        mv[off:self.size] = rest
        assert off + len(rest) == self.size, (off, len(rest), self.size)
        self._k_all = self._uniform([(o, r, 0, 0) for o, r in self._k])
        self._v_all = self._uniform(self._v)
        if n % b:
            self._place(self.n_blocks * b, n % b, memoryview(partial).cast("B"))

    def put(self, j: int, block: bytes | bytearray | memoryview) -> None:
        """Write block ``j`` (0-based, ``b`` cells at positions ``j*b``...) into the state."""
        mv = memoryview(block).cast("B")
        if not 0 <= j < self.n_blocks or len(mv) != self.block_size:
            raise KVStateError(f"KV block {j} of {len(mv)} bytes does not fit ({self.n_blocks} of {self.block_size})")
        self._place(j * self.b, self.b, mv)

    def _uniform(self, layers: list[tuple[int, int, int, int]]):
        """``(first offset, step, count, row, el, rows)`` when every layer of ``layers`` has one size and they are
        equally spaced (the usual case): a block is then placed by one numpy copy per cache half; None otherwise
        (placed layer by layer)."""
        if not layers or len({x[1:] for x in layers}) != 1:
            return None
        offs = [x[0] for x in layers]
        step = offs[1] - offs[0] if len(offs) > 1 else 0
        if any(b - a != step for a, b in zip(offs, offs[1:])):
            return None
        return (offs[0], step, len(offs), *layers[0][1:])

    def _runs(self, off: int, step: int, count: int, row: int, el: int, rows: int, start: int, m: int):
        """The destination of cells ``[start, start+m)`` of ``count`` layers spaced ``step`` bytes from ``off``, as
        a numpy array whose items are the contiguous runs (a void dtype of the run's bytes, so each is one memcpy
        however short: a transposed V's run is ``m`` elements of one row): shape ``(count,)``, or ``(count,
        rows)`` for a transposed V (``rows`` > 0)."""
        if rows:
            return np.ndarray((count, rows), dtype=f"V{m * el}", buffer=self.out, offset=off + start * el,
                              strides=(step, self.n_cells * el))
        return np.ndarray((count,), dtype=f"V{m * row}", buffer=self.out, offset=off + start * row, strides=(step,))

    def _place(self, start: int, m: int, seg: memoryview) -> None:
        halves = [self._k_all, self._v_all] if self._k_all is not None and self._v_all is not None else \
            [(o, 0, 1, r, 0, 0) for o, r in self._k] + [(o, 0, 1, *x) for o, *x in self._v]
        so = 0
        for off, step, count, row, el, rows in halves:
            dst = self._runs(off, step, count, row, el, rows, start, m)
            size = count * m * row
            dst[...] = np.frombuffer(seg, dtype=dst.dtype, count=dst.size, offset=so).reshape(dst.shape)
            so += size
        assert so == len(seg), (so, len(seg))
