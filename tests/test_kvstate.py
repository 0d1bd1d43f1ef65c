"""KV blocks cut out of real llama.cpp sequence states and joined back (ollapy.cache.kvstate), byte for byte.

States come from the real test models through ollapy's Backend: SmolLM2 (one KV cache) and Gemma 3 (iSWA:
a full-attention cache, then a sliding-window one), f16 KV with V transposed (flash attention off) and not
(on), and q8_0 KV (flash attention on, as llama.cpp requires for a quantized V).
"""
from __future__ import annotations

import struct
from array import array

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ollapy.cache.kvstate import KVStateError, join_state, parse_layout, prefix_state, split_state

CONFIGS = [("smollm2", "f16", "off"), ("smollm2", "f16", "on"), ("smollm2", "q8_0", "auto"),
           ("gemma3", "f16", "off"), ("gemma3", "q8_0", "auto")]
WINDOW = 512  # Gemma 3 270M's sliding window


def prefill(b, seq: int, toks: list[int], start: int = 0) -> None:
    """Decode ``toks`` at positions ``start..`` into ``seq`` in chunks of n_batch; logits for the last one."""
    for i in range(0, len(toks), b.n_batch):
        chunk = toks[i:i + b.n_batch]
        last = i + len(chunk) == len(toks)
        b.decode(array("i", chunk), array("i", range(start + i, start + i + len(chunk))), array("i", [seq] * len(chunk)),
                 array("b", [0] * (len(chunk) - 1) + [1 if last else 0]))


def continue_greedy(b, seq: int, last: int, pos: int, n: int) -> tuple[bytes, list[int]]:
    """Decode ``last`` alone at ``pos`` in ``seq``, then ``n`` greedy steps: (first logits row's bytes, tokens)."""
    b.decode(array("i", [last]), array("i", [pos]), array("i", [seq]), array("b", [1]))
    first = b.logits_row(0).tobytes()
    out = [int(np.argmax(b.logits_row(0)))]
    while len(out) < n:
        b.decode(array("i", [out[-1]]), array("i", [pos + len(out)]), array("i", [seq]), array("b", [1]))
        out.append(int(np.argmax(b.logits_row(0))))
    return first, out


def take_state(b, toks: list[int], seq: int = 1) -> bytes:
    b.seq_clear(seq)
    prefill(b, seq, toks)
    state = bytes(b.state_get(seq))
    b.seq_clear(seq)
    assert state
    return state


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "-".join(c))
def model(request):
    from ollapy.engine.backend.context import Backend, ContextConfig

    name, kv, fa = request.param
    path = request.getfixturevalue("smollm2_path" if name == "smollm2" else "gemma_path")
    b = Backend(path, ContextConfig(n_parallel=3, num_ctx=1024, kv_cache_type=kv, flash_attn=fa))
    b.name = name
    b.full = (name, kv, fa) != ("smollm2", "f16", "on")  # V not transposed in f16: the round trip covers it
    yield b
    b.close()


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1), seq=st.integers(0, 2))
@example(n=1, seed=1, seq=0).via("one token")
@example(n=256, seed=2, seq=2).via("exactly 16, 4 and 1 blocks")
def test_split_join_round_trips_real_states(model, n, seed, seq):
    toks = np.random.default_rng(seed).integers(10, model.n_vocab, n).tolist()
    state = take_state(model, toks, seq)
    layout = parse_layout(state)
    assert layout is not None and layout.n_cells == n
    assert layout.n_parts == (2 if model.name == "gemma3" else 1)
    assert layout.v_trans == (model.flash_attn == "off")
    for b in (16, 64, 256):
        s = split_state(state, b)
        assert s is not None and s.n_cells == n and len(s.blocks) == n // b
        assert all(len(blk) == b * layout.bytes_per_cell for blk in s.blocks)
        assert join_state(s.blocks, s.tail) == state
        assert join_state([memoryview(x) for x in s.blocks], bytearray(s.tail)) == state


def test_joined_state_restores_into_another_slot_bit_for_bit(model):
    if not model.full:
        pytest.skip("the round trip covers f16 with flash attention on")
    toks = np.random.default_rng(7).integers(10, model.n_vocab, 300).tolist()
    model.seq_clear(1)
    prefill(model, 1, toks[:-1])
    state = bytes(model.state_get(1))
    want = continue_greedy(model, 1, toks[-1], len(toks) - 1, 8)
    model.seq_clear(1)
    s = split_state(state, 64)
    assert s is not None and len(s.blocks) == 4
    assert model.state_set(0, join_state(s.blocks, s.tail))
    assert model.seq_pos_max(0) == len(toks) - 2
    got = continue_greedy(model, 0, toks[-1], len(toks) - 1, 8)
    model.seq_clear(0)
    assert got == want  # the same logits, bit for bit, and the same greedy tokens


def test_prefix_state_restores_like_a_cold_prefill(model, n=250, k=2):
    """``prefix_state`` of k blocks of 64 is the state a cold prefill of those k*64 tokens leaves (Gemma too, while
    the whole sequence fits its sliding window: the SWA cache then holds every position and is cut alike)."""
    if not model.full:
        pytest.skip("the round trip covers f16 with flash attention on")
    toks = np.random.default_rng(n).integers(10, model.n_vocab, n + 1).tolist()
    s = split_state(take_state(model, toks[:n]), 64)
    pre = prefix_state(s.blocks, s.tail, k)
    assert pre is not None
    cold = take_state(model, toks[:k * 64])
    if model.row_invariant:  # every row computes alike whatever the chunk around it: the bytes agree
        assert pre == cold
    assert model.state_set(2, pre)
    assert model.seq_pos_max(2) == k * 64 - 1
    got = continue_greedy(model, 2, toks[k * 64], k * 64, 6)
    model.seq_clear(2)
    assert model.state_set(2, cold)
    want = continue_greedy(model, 2, toks[k * 64], k * 64, 6)
    model.seq_clear(2)
    assert got[1] == want[1]
    assert prefix_state(s.blocks[:k], s.tail, k) == pre  # only the blocks it uses are needed
    assert prefix_state(s.blocks, s.tail, 0) is None
    assert prefix_state(s.blocks, s.tail, n // 64 + 1) is None


def test_prefix_state_refuses_a_window_that_moved(model):
    if model.name != "gemma3":
        pytest.skip("only a sliding-window model drops cells")
    toks = np.random.default_rng(5).integers(10, model.n_vocab, WINDOW + 100).tolist()
    state = take_state(model, toks)
    s = split_state(state, 64)
    assert s is not None and join_state(s.blocks, s.tail) == state
    assert prefix_state(s.blocks, s.tail, 2) is None  # the SWA cache no longer holds positions 0..127


def test_holes_and_shifted_positions_are_not_split(model):
    if not model.full:
        pytest.skip("the round trip covers f16 with flash attention on")
    toks = np.random.default_rng(11).integers(10, model.n_vocab, 120).tolist()
    model.seq_clear(1)
    prefill(model, 1, toks)
    assert model.seq_rm(1, 40, 60)  # a hole
    assert split_state(bytes(model.state_get(1)), 16) is None
    if model.can_shift:
        model.seq_clear(1)
        prefill(model, 1, toks)
        model.seq_rm(1, 0, 10)
        model.seq_add(1, 10, -1, -10)  # positions 0..109 again, but KV rotated: still a prefix in position order
        shifted = bytes(model.state_get(1))
        assert split_state(shifted, 16) is not None  # positions are all split_state can check
        model.seq_clear(1)
        prefill(model, 1, toks)
        model.seq_rm(1, 0, 10)  # positions 10..119: not a prefix
        assert split_state(bytes(model.state_get(1)), 16) is None
    model.seq_clear(1)


@pytest.fixture(scope="module")
def smol_state(smollm2_path):
    from ollapy.engine.backend.context import Backend, ContextConfig

    with Backend(smollm2_path, ContextConfig(n_parallel=1, num_ctx=512, flash_attn="off")) as b:
        return take_state(b, np.random.default_rng(3).integers(10, b.n_vocab, 150).tolist(), 0)


def _flip(data: bytes, off: int, value: bytes) -> bytes:
    return data[:off] + value + data[off + len(value):]


def test_unknown_or_damaged_states_are_not_split(smol_state):
    s = smol_state
    assert split_state(s, 64) is not None
    assert split_state(_flip(s, 0, b"\0"), 64) is None  # another magic
    assert split_state(s[:-1], 64) is None  # truncated
    assert split_state(s[:len(s) // 2], 64) is None
    assert split_state(s + b"\0", 64) is None  # an extra byte
    assert split_state(s + bytes(8), 64) is None
    assert split_state(_flip(s, 8, struct.pack("<I", 2)), 64) is None  # n_stream
    cells = 8 + 4 + 4
    assert split_state(_flip(s, cells + 12 * 5, struct.pack("<i", 99)), 64) is None  # cell 5 at position 99
    assert split_state(_flip(s, cells + 4, struct.pack("<I", 2)), 64) is None  # a cell of two sequences
    assert split_state(_flip(s, cells + 12 * 3 + 8, struct.pack("<i", 1)), 64) is None  # a cell of another seq
    after_meta = cells + 12 * 150
    assert split_state(_flip(s, after_meta, struct.pack("<I", 0)), 64) is None  # v_trans flipped
    assert split_state(_flip(s, after_meta + 4, struct.pack("<I", 29)), 64) is None  # n_layer
    assert split_state(_flip(s, after_meta + 8, struct.pack("<i", 9)), 64) is None  # K type
    assert split_state(_flip(s, after_meta + 12, struct.pack("<Q", 386)), 64) is None  # K row size
    assert split_state(b"", 64) is None
    with pytest.raises(ValueError):
        split_state(s, 0)


def test_inconsistent_blocks_or_tails_raise(smol_state):
    sp = split_state(smol_state, 64)
    blocks, tail = sp.blocks, sp.tail
    with pytest.raises(KVStateError):
        join_state(blocks[:1], tail)  # a block missing
    with pytest.raises(KVStateError):
        join_state(blocks + [blocks[0]], tail)  # one too many
    with pytest.raises(KVStateError):
        join_state([blocks[0], blocks[1][:-1]], tail)  # a short block
    with pytest.raises(KVStateError):
        join_state(blocks, tail[:-1])  # truncated tail
    with pytest.raises(KVStateError):
        join_state(blocks, tail + b"\0")
    with pytest.raises(KVStateError):
        join_state(blocks, tail[:10])
    with pytest.raises(KVStateError):
        join_state(blocks, _flip(tail, 0, b"X"))  # not a tail
    with pytest.raises(KVStateError):
        join_state(blocks, _flip(tail, 4, struct.pack("<H", 2)))  # a version this module does not know
    with pytest.raises(KVStateError):
        join_state(blocks, _flip(tail, 16 + 8 + 8, struct.pack("<I", 149)))  # descriptor corrupt (n_cells)
    with pytest.raises(KVStateError):
        prefix_state(blocks[:1], tail, 2)
    assert join_state(blocks, tail) == smol_state


# ---- synthetic states: llama.cpp's layout written from its description, with random shapes and bytes ----------

def _cache(rng, n: int, pos, shape: dict) -> tuple[bytes, dict]:
    """One ``llama_kv_cache::state_write`` output of ``n`` cells at ``pos``, and its data by layer."""
    k = [rng.integers(0, 256, (n, row), dtype=np.uint8) for row in shape["k_rows"]]
    if shape["v_trans"]:
        v = [rng.integers(0, 256, (embd, n * 2), dtype=np.uint8) for embd in shape["embd"]]
    else:
        v = [rng.integers(0, 256, (n, row), dtype=np.uint8) for row in shape["k_rows"]]
    return _cache_bytes(pos, shape, k, v), {"k": k, "v": v}


def _cache_bytes(pos, shape: dict, k: list, v: list) -> bytes:
    n = len(pos)
    out = [struct.pack("<I", shape["n_stream"])]
    for s in range(shape["n_stream"]):
        out.append(struct.pack("<I", n if s == shape["stream"] else 0))
        if s != shape["stream"]:
            continue
        out.extend(struct.pack("<iIi", p, 1, shape["seq"]) for p in pos)
        out.append(struct.pack("<II", int(shape["v_trans"]), len(k)))
        for t, kk in zip(shape["types"], k):
            out.append(struct.pack("<iQ", t, kk.shape[1]) + kk.tobytes())
        for t, embd, vv in zip(shape["types"], shape["embd"], v):
            head = struct.pack("<iII", t, 2, embd) if shape["v_trans"] else struct.pack("<iQ", t, vv.shape[1])
            out.append(head + vv.tobytes())
    return b"".join(out)


def draw_shape(draw) -> dict:
    """A random KV cache shape (for :func:`_cache`): V transposed or not, 1-3 layers of f32, f16 or q8_0, 1-3
    streams with the cells in one of them."""
    v_trans = draw(st.booleans())
    n_layer = draw(st.integers(1, 3))
    types = [1 if v_trans else draw(st.sampled_from([1, 8, 0])) for _ in range(n_layer)]
    embd = [draw(st.sampled_from([32, 64])) for _ in range(n_layer)]
    k_rows = [{0: 4 * e, 1: 2 * e, 8: 34 * e // 32}[t] for t, e in zip(types, embd)]
    n_stream = draw(st.integers(1, 3))
    return {"n_stream": n_stream, "stream": draw(st.integers(0, n_stream - 1)), "seq": draw(st.integers(0, 7)),
            "v_trans": v_trans, "types": types, "embd": embd, "k_rows": k_rows}


@st.composite
def synthetic_states(draw):
    n = draw(st.integers(1, 90))
    shape = draw_shape(draw)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base, data = _cache(rng, n, range(n), shape)
    swa = draw(st.sampled_from(["none", "whole", "window"]))
    rest, rest_data = b"", None
    if swa != "none":
        w = n if swa == "whole" else draw(st.integers(1, n))
        swa_shape = dict(shape, types=[1], embd=[32], k_rows=[64])
        rest, rest_data = _cache(rng, w, range(n - w, n), swa_shape)
        rest_data = (swa_shape, w, rest_data)
    state = struct.pack("<Ii", 0xAF143CD8, shape["seq"]) + base + rest
    return state, shape, data, rest_data


@settings(max_examples=150, deadline=None)
@given(case=synthetic_states(), b=st.integers(1, 40), k=st.integers(1, 4))
def test_synthetic_states_round_trip_and_cut(case, b, k):
    from ollapy.cache.kvstate import StateAssembler, join_into, joined_size

    state, shape, data, rest_data = case
    n = len(data["k"][0])
    s = split_state(state, b)
    assert s is not None and s.n_cells == n and len(s.blocks) == n // b
    assert join_state(s.blocks, s.tail) == state
    buf = bytearray(joined_size(s.tail) + 3)
    assert join_into(s.blocks, s.tail, buf) == len(state) and buf[:len(state)] == state
    asm = StateAssembler(s.tail, bytearray(joined_size(s.tail)))  # the remote tier's: blocks in any order
    for j in sorted(range(len(s.blocks)), key=lambda j: (j * 7919) % (len(s.blocks) or 1)):
        asm.put(j, s.blocks[j])
    assert asm.size == len(state) and asm.out[:asm.size] == state
    got = prefix_state(s.blocks, s.tail, k)
    if k * b > n or (rest_data is not None and rest_data[1] != n):
        assert got is None
        return
    m = k * b  # the same state written from the first m cells' data only
    want = struct.pack("<Ii", 0xAF143CD8, shape["seq"]) + _cache_bytes(
        range(m), shape, [x[:m] for x in data["k"]],
        [x[:, :2 * m] if shape["v_trans"] else x[:m] for x in data["v"]])
    if rest_data is not None:
        swa_shape, _, rd = rest_data
        want += _cache_bytes(range(m), swa_shape, [x[:m] for x in rd["k"]],
                             [x[:, :2 * m] if swa_shape["v_trans"] else x[:m] for x in rd["v"]])
    assert got == want


def test_synthetic_layouts_not_recognised():
    rng = np.random.default_rng(1)
    shape = {"n_stream": 2, "stream": 1, "seq": 0, "v_trans": False, "types": [1], "embd": [32], "k_rows": [64]}
    head = struct.pack("<Ii", 0xAF143CD8, 0)
    cache = _cache(rng, 5, range(5), shape)[0]  # stream 0 empty, stream 1 holds the cells
    assert split_state(head + cache, 4) is not None
    one = _cache(rng, 5, range(5), dict(shape, n_stream=1, stream=0))[0][4:]  # count, cells and data of a stream
    assert split_state(head + struct.pack("<I", 2) + one + one, 4) is None  # two streams hold cells
    assert split_state(head + cache + cache + cache, 4) is None  # a third cache: not a layout this module knows
    assert split_state(head + _cache(rng, 5, range(3, 8), shape)[0], 4) is None  # positions 3..7
    assert split_state(head + _cache(rng, 5, [0, 2, 1, 3, 4], shape)[0], 4) is None  # out of order
    assert split_state(head + struct.pack("<II", 1, 0), 4) is None  # no cells at all
    assert split_state(head + _cache(rng, 5, range(5), dict(shape, types=[13]))[0], 4) is None  # not a KV type
