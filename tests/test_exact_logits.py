"""Bit-exact harness: the last prompt token's logits after a cold prefill and after a restored prefix.

Drives llama.cpp through ollapy's Backend in exactly the shapes the engine uses
(:mod:`ollapy.engine.prefix.evalorder`: chunks of ``[0, N-1)`` each in its own
``llama_decode``, the last prompt token alone) and compares logits byte for
byte. Both test models, weight repacking (``extra_bufts``) on and off.

What it established (and keeps checking), with the vendored llama.cpp:

* On a stock build the last prompt token evaluated inside a chunk and the same
  token evaluated alone give different logits (ggml-cpu multiplies a one-row
  product with ``vec_dot`` and a multi-row one with tinyBLAS, which accumulate
  in different orders; a large difference after int8 activation quantization).
  So the engine always evaluates it alone, cold or cached. ollapy's build lets
  tinyBLAS take one-row products too (scripts/install_llama.sh) and turns the
  tiled K-quant matmul off, so there the two agree (``Backend.row_invariant``);
  with repacked weights they still differ.
* Which other rows share a chunk does not matter (tinyBLAS keeps one
  accumulator per output element), except for repacked weights (Gemma's Q4_K
  with ``extra_bufts`` on), whose gemm kernel takes rows in groups of 4 and
  the remainder with gemv: chunks must start on a 4-token grid.
* A restored state is bit-exact, into any slot, trimmed to any canonical
  point, and other slots' decode rows beside the last token change nothing.
"""
from __future__ import annotations

from array import array

import pytest

from ollapy.engine.prefix.evalorder import canonical_reuse, grid_for, grid_points, next_chunk_end

N_PROMPT = 600  # crosses one n_ubatch (512) boundary
SYSTEM_END = 203  # a system prompt's end; the engine moves it down onto the model's grid (Harness.save_point)


@pytest.fixture(scope="module", params=[("smollm2", "on"), ("smollm2", "off"), ("gemma3", "on"), ("gemma3", "off")],
                ids=lambda p: f"{p[0]}-extra_bufts_{p[1]}")
def harness(request):
    from ollapy.engine.backend.context import Backend, ContextConfig

    name, bufts = request.param
    path = request.getfixturevalue("smollm2_path" if name == "smollm2" else "gemma_path")
    b = Backend(path, ContextConfig(n_parallel=6, num_ctx=1024, extra_bufts=bufts, flash_attn="off"))
    if bufts == "on" and not b.extra_bufts:  # an AMX CPU with an AMX build: ggml's AMX path would crash
        b.close()
        pytest.skip(f"this machine cannot repack weights: extra_bufts {b.extra_bufts_reason}")
    text = " ".join(f"Entry {i}: the courier with badge {i * 7 % 31} walks to street {i * 13 % 97} at dawn."
                    for i in range(80))
    toks = b.tokenize(text)[:N_PROMPT]
    assert len(toks) == N_PROMPT
    h = Harness(b, toks)
    h.row_invariant = not (name == "gemma3" and b.extra_bufts)  # Q4_K repacked: gemm takes rows in groups of 4
    yield h
    b.close()


class Harness:
    """Evaluate ``toks`` on a sequence in given chunks; read the last token's logits as bytes."""

    def __init__(self, backend, toks: list[int]) -> None:
        self.b = backend
        self.toks = toks
        self._cold: dict[tuple, bytes] = {}
        self.align = grid_for(backend.n_swa)  # 4, or 64 for a sliding-window model (evalorder.SWA_ALIGN)
        self.save_point = grid_points([SYSTEM_END], self.align)[0]

    def chunk(self, seq: int, start: int, end: int, want_last: bool = False) -> None:
        n = end - start
        want = array("b", [0] * (n - 1) + [1 if want_last else 0])
        self.b.decode(array("i", self.toks[start:end]), array("i", range(start, end)), array("i", [seq] * n), want)

    def canonical_prefill(self, seq: int, start: int, stop: int, points=None) -> list[tuple[int, int]]:
        """Chunks of ``[start, stop)`` exactly as the engine makes them (budget n_ubatch each step)."""
        points = (self.save_point,) if points is None else points
        done = []
        while start < stop:
            end = next_chunk_end(start, stop, self.b.n_ubatch, points, self.align)
            self.chunk(seq, start, end)
            done.append((start, end))
            start = end
        return done

    def last_alone(self, seq: int, others: tuple[tuple[int, int], ...] = ()) -> bytes:
        """Decode the last prompt token alone in its stream (plus ``others``: (seq, position) decode rows first)."""
        n = len(self.toks)
        t, p, s = array("i"), array("i"), array("i")
        for oseq, opos in others:
            t.append(self.toks[opos])
            p.append(opos)
            s.append(oseq)
        t.append(self.toks[n - 1])
        p.append(n - 1)
        s.append(seq)
        self.b.decode(t, p, s, array("b", [1] * len(t)))
        return self.b.logits_row(len(t) - 1).tobytes()

    def cold(self, seq: int = 0, points=None) -> bytes:
        """The reference: a cold canonical prefill (memoized per save-point set: the model is deterministic)."""
        points = (self.save_point,) if points is None else points
        key = tuple(points)
        if key not in self._cold:
            self._cold[key] = self._cold_run(seq, points)
        return self._cold[key]

    def _cold_run(self, seq: int, points) -> bytes:
        self.b.seq_clear(seq)
        self.canonical_prefill(seq, 0, len(self.toks) - 1, points)
        return self.last_alone(seq)

    def state_of_prefix(self, length: int, seq: int = 2) -> bytearray:
        """The state an earlier request leaves for ``length`` exact cells: chunks of ``[0, length)`` only."""
        self.b.seq_clear(seq)
        self.canonical_prefill(seq, 0, length)
        return self.b.state_get(seq)

    def cached(self, length: int, seq: int = 0, others=()) -> bytes:
        """Restore the state of ``length`` exact cells, resume at the canonical point, evaluate the tail as the
        engine does. A sliding-window state holds only the in-window cells of its SWA layers, so it can only be
        used whole: the prefix saved is then exactly the canonical one (the engine never trims such a state)."""
        n = len(self.toks)
        reuse = canonical_reuse(min(length, n - 1), n, self.align)
        state = self.state_of_prefix(length if self.b.n_swa == 0 else reuse)
        assert self.b.state_set(seq, state)
        assert self.b.seq_rm(seq, reuse, -1)
        self.canonical_prefill(seq, reuse, n - 1)
        for oseq, opos in others:  # other slots hold a short prefix and decode beside the last token
            self.b.seq_clear(oseq)
            self.chunk(oseq, 0, opos)
        return self.last_alone(seq, others)


def test_the_last_token_inside_a_chunk_is_what_it_is_alone_when_rows_are_invariant(harness):
    """The mechanism, both ways. With rows computed alike in any batch (the backend's ``row_invariant``: no
    tinyBLAS, no tiled K-quant matmul, no repacked weights) the last token inside a chunk gives the logits it
    gives alone; otherwise (a stock build, or repacked weights) one row vs a chunk of rows changes them, which is
    why the engine evaluates it alone always.

    Over 12 end positions (prompts of 521..532 tokens sharing a restored 520-token prefix), the last token's
    logits evaluated inside an 8-token chunk equal the same token's evaluated alone at every one when rows are
    invariant, and differ for at least one otherwise. (At one given position two kernels can round alike.)"""
    h = harness
    base = 520
    state = h.state_of_prefix(base, seq=2)
    differ = 0
    for end in range(base + 1, base + 13):
        h.b.state_set(0, state)
        h.canonical_prefill(0, base, end - 1)  # up to the last token; then the last token alone
        n = end - 1
        t = array("i", [h.toks[n]])
        h.b.decode(t, array("i", [n]), array("i", [0]), array("b", [1]))
        alone = h.b.logits_row(0).tobytes()
        h.b.state_set(0, state)
        start = max(base, end - 8)
        if start > base:
            h.canonical_prefill(0, base, start)
        h.chunk(0, start, end, want_last=True)
        differ += h.b.logits_row(end - start - 1).tobytes() != alone
    from ollapy.engine.backend.bindings import one_row_products_differ, tiled_matmul_on

    if h.row_invariant and not one_row_products_differ() and not tiled_matmul_on():  # SmolLM2's Q4_1: no repack
        assert differ == 0
    else:
        assert differ >= 1


def test_a_save_point_split_on_the_grid_computes_what_one_chunk_does(harness):
    assert harness.cold(points=()) == harness.cold(points=(harness.save_point,))


@pytest.mark.parametrize("length", [N_PROMPT - 1, N_PROMPT - 2, N_PROMPT - 17, 203, 512, 101])
def test_a_restored_prefix_gives_the_cold_logits_bit_for_bit(harness, length):
    h = harness
    cold = h.cold()
    assert h.cached(length) == cold


def test_a_restore_into_another_slot_beside_other_decode_rows_is_bit_exact(harness):
    h = harness
    cold = h.cold()
    assert h.cached(N_PROMPT - 1, seq=1, others=((0, 40), (2, 77))) == cold


def test_five_decode_rows_in_one_step_leave_the_answer_unchanged_for_row_invariant_weights(harness):
    """The concurrency guarantee the README states: with weights multiplied row by row (SmolLM2 Q4_1, Gemma's
    Q4_K without repacking), the last token's logits do not depend on 4 other slots decoding in the same step.
    Repacked Q4_K (Gemma with extra_bufts on) multiplies a 5-row ubatch with its 4-row gemm kernel: no
    guarantee there, and none claimed."""
    h = harness
    if not h.row_invariant:
        pytest.skip("repacked weights (extra_bufts on, Q4_K): the README states no concurrency guarantee")
    cold = h.cold()
    assert h.cached(N_PROMPT - 1, seq=1, others=((0, 40), (2, 77), (3, 13), (4, 150))) == cold


def _answered_state(h: Harness, end: int, seq: int, decoded: int = 4) -> None:
    """``seq`` holds ``[0, end)`` as a finished turn leaves it on an answer-reuse build: chunks, then ``decoded``
    decode-shaped rows (the last prompt token and the answer)."""
    h.b.seq_clear(seq)
    h.canonical_prefill(seq, 0, end - decoded, points=(end - decoded,))
    for p in range(end - decoded, end):
        h.b.decode(array("i", [h.toks[p]]), array("i", [p]), array("i", [seq]), array("b", [0]))


def _sliding_window_rows_invariant(h: Harness) -> None:
    if not h.b.n_swa or not h.row_invariant or not h.b.answer_reuse:
        pytest.skip("a sliding-window model (Gemma 3) on an answer-reuse build")


def test_a_sliding_window_state_ending_off_the_grid_restores_bit_exact(harness):
    """A state past the window (its first in-window position off the 64-token grid) restored with its window
    placed in the cold run's lanes (backend/window.py) gives the cold logits bit for bit, into a slot that held
    another sequence before too. The control: llama.cpp's own placement (cell 0 for the window's first
    position) does not, for at least one of the ends."""
    from types import SimpleNamespace

    from ollapy.engine.prefix.assignment import SlotAssigner

    h = harness
    _sliding_window_rows_invariant(h)
    n, cold, control = len(h.toks), h.cold(), []
    holed = SlotAssigner(SimpleNamespace(backend=h.b)).window_holed
    for end in (541, 555, 579, 590):
        _answered_state(h, end, seq=2)
        state = h.b.state_get(2)
        for place in (True, False):
            _answered_state(h, 300, seq=0)  # the slot held another sequence
            assert h.b.state_set(0, state, place_window=place)
            if place:
                first = end - h.b.n_swa
                assert h.b.window_floor(0) == first and h.b.seq_pos_min(0) == first - first % 64
                # a trim below the end would attend to the empty cells under the window: planned around
                assert holed(0, end - 1) and not holed(0, end)
            h.canonical_prefill(0, end, n - 1)
            got = h.last_alone(0)
            if place:
                assert got == cold, end
            else:
                control.append(got == cold)
    assert not all(control), "llama.cpp's own placement matched every time: the test would not see a regression"


def test_a_sliding_window_slot_trimmed_off_the_grid_continues_bit_exact(harness):
    """The slot's own cells (no restore: every cell where the earlier turn put it) trimmed to any position."""
    h = harness
    _sliding_window_rows_invariant(h)
    n, cold = len(h.toks), h.cold()
    for end, trim in ((560, 553), (590, 531), (599, 599)):
        _answered_state(h, end, seq=1)
        assert h.b.seq_rm(1, trim, -1)
        h.canonical_prefill(1, trim, n - 1)
        assert h.last_alone(1) == cold, (end, trim)
