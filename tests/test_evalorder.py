"""The canonical evaluation order's chunking rules (pure functions; the bit-exact effect is in test_exact_logits)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ollapy.engine.prefix.evalorder import ALIGN, canonical_reuse, grid_points, next_chunk_end


def chunks(start: int, stop: int, budgets, save_points=()):
    """The chunks a run makes of [start, stop) with per-step budgets (cycled)."""
    out, i = [], 0
    while start < stop:
        end = next_chunk_end(start, stop, budgets[i % len(budgets)], save_points)
        i += 1
        assert i < 10_000
        if end is None:
            continue
        out.append((start, end))
        start = end
    return out


@given(n=st.integers(2, 3000), budgets=st.lists(st.integers(8, 600), min_size=1, max_size=4),
       points=st.lists(st.integers(1, 3000), max_size=3))
def test_chunks_cover_the_prompt_in_pieces_of_two_or_more_on_the_grid(n, budgets, points):
    stop = n - 1
    points = grid_points(points)
    cs = chunks(0, stop, budgets, points)
    assert cs[0][0] == 0 and cs[-1][1] == stop
    for (_, b), (c, _) in zip(cs, cs[1:]):
        assert b == c
    for a, b in cs:
        assert b - a >= 2 or stop == 1
        assert stop - b != 1
        assert b == stop or b % ALIGN == 0  # every chunk starts on the grid (repacked weights group rows by 4)


@given(n=st.integers(2, 3000), reuse=st.integers(0, 3000), budget=st.integers(8, 600),
       points=st.lists(st.integers(1, 3000), max_size=3))
def test_a_resumed_run_makes_the_cold_runs_chunk_boundaries(n, reuse, budget, points):
    """From a canonical reuse point, every later chunk boundary is one a cold run may also make (grid/stop)."""
    points = grid_points(points)
    reuse = canonical_reuse(min(reuse, n - 1), n)
    stop = n - 1
    assert reuse == 0 or reuse == stop or (stop - reuse >= 2 and reuse % ALIGN == 0)
    for a, b in chunks(reuse, stop, [budget], points):
        assert b - a >= 2 or stop == 1
        assert b == stop or b % ALIGN == 0


def test_the_last_prompt_token_is_never_in_a_chunk():
    assert next_chunk_end(0, 459, 512) == 459  # region [0, N-1): token N-1 is evaluated alone, as a decode row
    assert canonical_reuse(459, 460) == 459  # a restore may cover everything but the last token
    assert canonical_reuse(458, 460) == 456  # never a 1-token tail: back to the grid
    assert next_chunk_end(0, 5, 4) == 3  # a budget under 2 * ALIGN goes off the grid rather than waiting forever


def test_save_points_move_down_onto_the_grid():
    assert grid_points((203, 3, 512, 514)) == (200, 512)
