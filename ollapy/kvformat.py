"""The byte layout of one llama.cpp KV cache inside a sequence state, parsed without copying.

``llama_kv_cache::state_write`` (``src/llama-kv-cache.cpp`` in the llama.cpp that llama-cpp-python 0.3.36
vendors) writes, little-endian: ``u32 n_stream``; per stream ``u32 cell_count`` and, when not 0, per cell
``i32 pos, u32 n_seq_id, i32 seq_id``, then ``u32 v_trans, u32 n_layer``, per layer the K rows, per layer the V
rows (or, V transposed, per embedding element the cells' values). The full state layout and what the prompt
cache does with it are in :mod:`ollapy.cache.kvstate`; the engine's backend reads a sliding-window cache with
the same parser (:mod:`ollapy.engine.backend.window`). Shared by both, so neither imports the other.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

U32 = struct.Struct("<I")

# ggml types a KV cache can hold: type id -> (elements per block, bytes per block) (ggml/src/ggml.c type_traits)
GGML_TYPES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              20: (32, 18)}


class Unparsed(Exception):
    """The bytes are not a layout :func:`parse_cache` knows (its callers turn it into None or their own error)."""


@dataclass(frozen=True)
class CacheView:
    """One KV cache parsed out of a state: its shape, where its cell data lies, and its end offset."""

    shape: tuple  # (n_stream, stream, cell_seq, v_trans, k_types, k_rows, v_types, v_rows, v_elems, n_embd_v)
    n_cells: int
    from_zero: bool  # cells are positions 0..n_cells-1 in order
    k_offs: tuple[int, ...]  # offset of each layer's K data
    v_offs: tuple[int, ...]  # offset of each layer's V data
    end: int


def need(buf_len: int, end: int) -> None:
    """Raise :class:`Unparsed` when a field ending at byte ``end`` lies past a buffer of ``buf_len`` bytes."""
    if end > buf_len:
        raise Unparsed("truncated")


def parse_cache(mv: memoryview, off: int) -> CacheView:
    """Parse one ``llama_kv_cache::state_write`` output at ``off``; at most one stream may hold cells."""
    n = len(mv)
    need(n, off + 4)
    n_stream = U32.unpack_from(mv, off)[0]
    if not 1 <= n_stream <= 4096:
        raise Unparsed("n_stream")
    off += 4
    stream, count = -1, 0
    for s in range(n_stream):
        need(n, off + 4)
        c = U32.unpack_from(mv, off)[0]
        off += 4
        if c == 0:
            continue
        if stream >= 0:
            raise Unparsed("several streams hold cells")
        stream, count = s, c
        need(n, off + 12 * c + 8)
        meta = np.frombuffer(mv, dtype="<i4", count=3 * c, offset=off).reshape(c, 3)
        if not (meta[:, 1] == 1).all():
            raise Unparsed("a cell of several sequences (or cell extensions)")
        seq = int(meta[0, 2])
        if not (meta[:, 2] == seq).all():
            raise Unparsed("cells of several sequences")
        from_zero = bool((meta[:, 0] == np.arange(c, dtype=np.int32)).all())
        off += 12 * c
        v_trans, n_layer = struct.unpack_from("<II", mv, off)
        off += 8
        if v_trans > 1 or not 1 <= n_layer <= 4096:
            raise Unparsed("v_trans or n_layer")
        k_types, k_rows, k_offs = [], [], []
        for _ in range(n_layer):
            need(n, off + 12)
            t, row = struct.unpack_from("<iQ", mv, off)
            if t not in GGML_TYPES or row == 0 or row % GGML_TYPES[t][1]:
                raise Unparsed("K type or row size")
            k_types.append(t), k_rows.append(row), k_offs.append(off + 12)
            off += 12 + c * row
            need(n, off)
        v_types, v_rows, v_elems, n_embd_v, v_offs = [], [], [], [], []
        for _ in range(n_layer):  # every layer has V (layers without V would not parse: None)
            if v_trans:
                need(n, off + 12)
                t, el, embd = struct.unpack_from("<iII", mv, off)
                if t not in GGML_TYPES or GGML_TYPES[t] != (1, el) or embd == 0:
                    raise Unparsed("transposed V type")
                row, head = el * embd, 12
            else:
                need(n, off + 12)
                t, row = struct.unpack_from("<iQ", mv, off)
                if t not in GGML_TYPES or row == 0 or row % GGML_TYPES[t][1]:
                    raise Unparsed("V type or row size")
                el, embd, head = 0, 0, 12
            v_types.append(t), v_rows.append(row), v_elems.append(el), n_embd_v.append(embd), v_offs.append(off + head)
            off += head + c * row
            need(n, off)
        shape = (n_stream, stream, seq, bool(v_trans), tuple(k_types), tuple(k_rows), tuple(v_types), tuple(v_rows),
                 tuple(v_elems), tuple(n_embd_v))
    if stream < 0:
        shape = (n_stream, -1, 0, False, (), (), (), (), (), ())
        return CacheView(shape, 0, True, (), (), off)
    return CacheView(shape, count, from_zero, tuple(k_offs), tuple(v_offs), off)


