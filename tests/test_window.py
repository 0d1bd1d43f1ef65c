"""A sliding-window cache placed in the cold run's lanes: empty cells in front of the window (backend/window.py).

Synthetic caches in llama.cpp's layout (``tests/test_kvstate.py`` writes them from its description) check the
bytes: the window's cells and data unchanged, ``first mod 64`` empty cells with zero K and V before them, at
the positions just below the window. ``tests/test_exact_logits.py`` checks what it is for: a Gemma 3 state that
ends off the 64-token grid restores bit-exact.
"""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kvstate import _cache, _cache_bytes, draw_shape, synthetic_states

from ollapy.engine.backend.window import WindowError, align_window, place_state, window_pad, window_pieces

HEAD = struct.pack("<Ii", 0xAF143CD8, 0)


@st.composite
def windows(draw):
    shape = draw_shape(draw)
    first, n = draw(st.integers(0, 700)), draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rest, data = _cache(rng, n, range(first, first + n), shape)
    return rest, shape, data, first, n


@settings(max_examples=150, deadline=None)
@given(case=windows(), grid=st.sampled_from([16, 64]))
def test_the_window_gets_first_mod_grid_empty_cells_in_front(case, grid):
    rest, shape, data, first, n = case
    k = first % grid
    assert window_pad(rest, grid) == k
    got = align_window(rest, grid)
    if k == 0:
        assert got is rest and window_pieces(rest, grid) is None
        return
    zero_k = [np.zeros((k, row), np.uint8) for row in shape["k_rows"]]
    if shape["v_trans"]:
        v = [np.concatenate([np.zeros((x.shape[0], 2 * k), np.uint8), x], axis=1) for x in data["v"]]
    else:
        v = [np.concatenate([np.zeros((k, x.shape[1]), np.uint8), x]) for x in data["v"]]
    want = _cache_bytes(range(first - k, first + n), shape, [np.concatenate([z, x]) for z, x in zip(zero_k, data["k"])], v)
    assert bytes(got) == want
    assert (first - k) % grid == 0
    pieces = window_pieces(rest, grid)  # the same bytes, the cells read where ``rest`` holds them
    assert b"".join(ctypes.string_at(int(p), int(n)) for p, n in zip(pieces.ptrs, pieces.sizes)) == want


@settings(max_examples=60, deadline=None)
@given(case=synthetic_states())
def test_a_whole_state_keeps_its_first_cache_and_aligns_the_window(case):
    state, shape, data, rest_data = case
    out, first = place_state(state, segments=False)
    if rest_data is None:
        assert out is state and first == 0
        return
    swa_shape, w, rd = rest_data
    n = len(data["k"][0])
    assert first == n - w
    base_end = len(state) - len(_cache_bytes(range(n - w, n), swa_shape, rd["k"], rd["v"]))
    assert bytes(out[:base_end]) == state[:base_end]
    assert bytes(out[base_end:]) == bytes(align_window(memoryview(state)[base_end:]))
    pieces, _ = place_state(state, segments=True)
    if out is state:
        assert pieces is state
    else:  # two pieces: the first cache where it lies, the aligned window
        joined = b"".join(ctypes.string_at(int(p), int(s)) for p, s in zip(pieces.ptrs, pieces.sizes))
        assert joined == bytes(out)


def test_cells_that_are_not_consecutive_positions_are_refused():
    rng = np.random.default_rng(3)
    shape = {"n_stream": 1, "stream": 0, "seq": 0, "v_trans": False, "types": [1], "embd": [32], "k_rows": [64]}
    holed = _cache(rng, 4, [100, 101, 103, 104], shape)[0]
    with pytest.raises(WindowError, match="not consecutive"):
        align_window(holed)
    with pytest.raises(WindowError):
        align_window(holed[:-5])  # truncated
    assert place_state(b"not a state at all", segments=False) == (b"not a state at all", 0)
