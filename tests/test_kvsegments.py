"""A state kept as KV blocks, restored from the blocks where they lie (ollapy.cache.kvsegments + the patched
``llama_state_seq_set_data_segments``): the pieces are exactly the joined state's bytes, and llama.cpp reads
them into the KV cache as it reads the joined state, bit for bit."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kvstate import CONFIGS, continue_greedy, prefill, synthetic_states

from ollapy.cache.kvsegments import join_segments
from ollapy.cache.kvstate import KVStateError, join_state, split_state


@settings(max_examples=150, deadline=None)
@given(case=synthetic_states(), b=st.integers(1, 40))
def test_pieces_are_the_joined_state(case, b):
    state = case[0]
    s = split_state(state, b)
    assert s is not None
    segs = join_segments(s.blocks, s.tail)
    assert segs.nbytes == len(state) == int(segs.sizes.sum())
    assert segs.tobytes() == state
    assert segs.join() == state


def test_pieces_refuse_what_join_refuses():
    rng = np.random.default_rng(3)
    from test_kvstate import _cache  # one synthetic state: 100 cells, V transposed, in the second of two streams

    shape = {"n_stream": 2, "stream": 1, "seq": 0, "v_trans": True, "types": [1, 1], "embd": [32, 64],
             "k_rows": [64, 128]}
    base, _ = _cache(rng, 100, range(100), shape)
    state = struct.pack("<Ii", 0xAF143CD8, 0) + base
    s = split_state(state, 16)
    assert join_segments(s.blocks, s.tail).tobytes() == state
    with pytest.raises(KVStateError):
        join_segments(s.blocks[:-1], s.tail)  # a block missing
    with pytest.raises(KVStateError):
        join_segments(s.blocks[:-1] + [s.blocks[-1][:-1]], s.tail)  # a short block
    with pytest.raises(KVStateError):
        join_segments(s.blocks, s.tail[:20])  # a truncated tail


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "-".join(c))
def model(request):
    from ollapy.engine.backend.context import Backend, ContextConfig

    name, kv, fa = request.param
    path = request.getfixturevalue("smollm2_path" if name == "smollm2" else "gemma_path")
    b = Backend(path, ContextConfig(n_parallel=3, num_ctx=1024, kv_cache_type=kv, flash_attn=fa))
    if not b.restores_segments:
        b.close()
        pytest.fail("this llama-cpp-python build lacks llama_state_seq_set_data_segments: "
                    "run scripts/install_llama.sh (ollapy's patched build)")
    yield b
    b.close()


@pytest.mark.parametrize("n, block", [(300, 64), (700, 256), (64, 64)])
def test_a_segment_restore_equals_the_joined_one(model, n, block):
    """Restored from pieces into another slot: the state reads back as after a joined restore, and the next token's
    logits and the greedy continuation are those of the slot that computed it (Gemma's sliding window too)."""
    toks = np.random.default_rng(n).integers(10, model.n_vocab, n).tolist()
    model.seq_clear(1)
    prefill(model, 1, toks[:-1])
    state = bytes(model.state_get(1))
    want = continue_greedy(model, 1, toks[-1], n - 1, 6)
    model.seq_clear(1)
    s = split_state(state, block)
    assert s is not None and len(s.blocks) == (n - 1) // block
    segs = join_segments([memoryview(x) for x in s.blocks], s.tail)
    assert model.state_set(2, join_state(s.blocks, s.tail))  # the joined restore, as the reference
    joined = bytes(model.state_get(2))
    model.seq_clear(2)
    assert model.state_set(2, segs)
    assert bytes(model.state_get(2)) == joined  # (the header and cells name seq 2 in both)
    model.seq_clear(2)
    assert model.state_set(0, segs)
    assert model.seq_pos_max(0) == n - 2
    assert continue_greedy(model, 0, toks[-1], n - 1, 6) == want
    model.seq_clear(0)


def test_a_truncated_piece_list_is_refused_and_leaves_the_slot_empty(model):
    toks = np.random.default_rng(5).integers(10, model.n_vocab, 200).tolist()
    model.seq_clear(1)
    prefill(model, 1, toks)
    state = bytes(model.state_get(1))
    model.seq_clear(1)
    s = split_state(state, 64)
    segs = join_segments(s.blocks, s.tail)
    segs.ptrs, segs.sizes = segs.ptrs[:-3], segs.sizes[:-3]
    prefill(model, 0, toks[:10])
    assert not model.state_set(0, segs)
    assert model.seq_pos_max(0) == -1
