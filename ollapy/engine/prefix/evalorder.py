"""The canonical evaluation order: every prompt is evaluated in the same shapes, cold or from the cache.

Why (see ``tests/test_exact_logits.py`` and "Exactness" in
docs/design/architecture.md): ggml-cpu picks a matrix-multiply kernel by the number of rows of the
right-hand operand. ``llamafile_sgemm`` (tinyBLAS) declines ``n < 2``
("only enable sgemm for prompt processing", ``ggml/src/ggml-cpu/llamafile/sgemm.cpp``),
so a product with one row goes through ``ggml_vec_dot_*`` instead. The two
accumulate in different orders, so their results differ in the last bits.
With the KV cache not unified (one stream per sequence), the attention
products ``K·q`` and ``V·softmax`` of a stream have as many rows as that
stream's tokens in the ubatch: a token evaluated alone and the same token
evaluated inside a prompt chunk get different attention bits, so different
KV cells in every later layer and different logits. tinyBLAS itself keeps one
accumulator per output element over ``k`` whatever its tile shape, so a row's
result does not depend on WHICH other rows share its chunk, only on whether it
is alone. Weight matrices of the test models (Q4_1, Q4_K/Q6_K) go through
``vec_dot`` at any row count, so they are row-invariant.

The order (both the cold run and a run that starts from a cached prefix
follow it, so they compute every KV cell and the final logits identically):

1. Prompt tokens ``[0, N-1)`` are evaluated in chunks of at least 2 tokens of
   one sequence, each chunk in its own ``llama_decode`` (so llama.cpp's
   ``split_equal`` never mixes another sequence's rows into it and never
   leaves a 1-token remainder). Every chunk starts on a grid of :data:`ALIGN`
   tokens and ends at ``N-1``, at a save point (where the prompt cache stores
   a state; moved onto the grid, :func:`grid_points`), or at a grid point
   within the step's token budget; it never leaves exactly one token before
   ``N-1``. The one exception: a 2-token prompt, whose first token is alone
   in every run.
2. The last prompt token ``N-1`` is evaluated alone in its stream, in the same
   ``llama_decode`` as the other slots' decode tokens: a decode-shaped row,
   exactly as every generated token is.
3. A reused prefix (own slot, copied slot, restored state) covers only cells
   computed by rule 1 (``Slot.exact``): never the last prompt token or the
   generated tokens, which a longer cold prompt would compute inside a chunk.
   When the prefix would leave exactly one token before ``N-1``, it is moved
   back by one token (:func:`canonical_reuse`), so the tail is a chunk of 2.

   The exception, **answer reuse**: on a build where a row computes alike alone
   and inside a chunk (``Backend.answer_reuse``: tinyBLAS takes one-row
   products too, no tiled K-quant matmul, no repacked weights, no GPU, no CPU
   flash attention), a decode-shaped row's cells ARE what a chunk computes. There
   ``Slot.exact`` follows the last prompt token and the generated tokens, a
   finished state keeps the answer, and the next turn prefills only the new
   message and the template's turn markers. The 4-token grid, which exists for
   repacked weights, no longer binds a reused prefix, nor does a sliding-window
   model's 64-token grid: a restore places the window's cells in the cold run's
   lanes wherever the state ends (:mod:`ollapy.engine.backend.window`), and a
   slot's own cells sit where the earlier turn put them.
   ``tests/test_answer_reuse.py`` holds it to: turn 3 of 20 three-turn
   conversations per test model, from the cache, equals turn 3 cold; and
   ``tests/test_exact_logits.py`` to the cold logits bit for bit.
"""
from __future__ import annotations

from collections.abc import Sequence

ALIGN = 4
"""Chunk starts are multiples of this (rule 1): ggml-cpu's repacked weights (``repack.cpp``) multiply rows in
groups of 4 with a gemm kernel and the remainder with a gemv kernel, which round differently."""
SWA_ALIGN = 64
"""The grid of a sliding-window model (:func:`grid_for`). A saved state holds only the in-window cells of its
SWA layers; llama.cpp restores them from KV cell 0 instead of at their positions, so the attention sums over the
KV dimension would see every key shifted by the first kept position. The sums group keys by index (16 lanes, 4
accumulators: ``GGML_F16_STEP`` 64 in ``vec_dot_f16``; ``KN`` 16 in tinyBLAS): a shift by a multiple of 64 keeps
every key in its lane, and the masked keys before it add exact zeros; any other shift can change a greedy answer.
The backend therefore restores a window behind ``first mod 64`` empty cells (:mod:`ollapy.engine.backend.window`),
which makes the shift a multiple of 64 wherever the state ends. Chunks and save points still start on this grid
on a build without answer reuse (there a finished state ends where its prompt's chunks ended)."""


def grid_for(n_swa: int) -> int:
    """The chunk grid of a model: :data:`SWA_ALIGN` with a sliding window (``n_swa`` > 0), else :data:`ALIGN`."""
    return SWA_ALIGN if n_swa else ALIGN


def canonical_reuse(reuse: int, n_prompt: int, align: int = ALIGN, unshifted: int = 0) -> int:
    """Largest prefix length ``<= reuse`` from which a cold run's chunking can be resumed, for ``n_prompt`` tokens.

    A reused prefix must end where every cold run of this prompt ends a
    chunk: on the model's grid ``align`` (:func:`grid_for`; save points are
    moved onto it by :func:`grid_points`; 1 on an answer-reuse build), or at
    ``n_prompt - 1`` (not for a sliding-window model, whose states must sit on
    its grid, except those of at most ``unshifted`` tokens: an answer-reuse
    build's ``n_swa``, see rule 3); and the tail ``[reuse, n_prompt-1)`` must
    be empty or at least 2 tokens (rule 3).
    Raises ValueError when ``reuse`` leaves no prompt token to evaluate.
    """
    stop = n_prompt - 1
    if not 0 <= reuse <= stop:
        raise ValueError(f"reuse {reuse} must leave at least one of {n_prompt} prompt tokens to evaluate")
    def resumable(r: int) -> bool:
        # the last prompt token's position ends every run's chunks (the 4-grid's partial group is the same), but a
        # sliding-window state must sit on its grid whatever its length (see SWA_ALIGN)
        on_grid = r % align == 0 or (align == ALIGN and r == stop) or r <= unshifted
        return on_grid and (r == stop or stop - r >= 2)

    while reuse > 0 and not resumable(reuse):
        reuse -= 1
    assert reuse == 0 or reuse == stop or stop - reuse >= 2
    return reuse


def grid_points(points: Sequence[int], align: int = ALIGN) -> tuple[int, ...]:
    """Save points moved down onto the :data:`ALIGN` grid (a prefix of a shared prefix is still shared).

    Every chunk then starts on the grid in every run, so repacked weights
    group the same rows in fours whatever the run (ggml-cpu ``repack.cpp``
    counts its groups from the chunk's first row).
    """
    return tuple(sorted({p - p % align for p in points} - {0}))


def next_chunk_end(start: int, stop: int, budget: int, save_points: Sequence[int] = (), align: int = ALIGN) -> int | None:
    """End of the next prefill chunk ``[start, end)`` of the region ``[start, stop)``, or None to wait a step.

    ``stop`` is the last prompt token's position (``N-1``: rule 2 evaluates it
    apart); ``budget`` the most tokens this chunk may hold (the step's budget,
    at most ``n_ubatch``); ``save_points`` sorted positions where a chunk
    should end so the cache can store the prefix. The result keeps rule 1:
    ``end - start >= 2`` (unless the whole region is one token) and
    ``stop - end != 1``. Returns None when the budget cannot hold such a chunk.
    """
    assert 0 <= start < stop, (start, stop)
    if stop - start == 1:  # a 2-token prompt: its first token is alone in every run
        return stop if budget >= 1 else None
    end = min(stop, start + budget)
    for p in sorted(save_points):
        if start + 2 <= p < end and stop - p != 1:
            return p
    if end < stop:
        aligned = end - end % align  # the next chunk starts on the grid
        if stop - aligned == 1:
            aligned -= align
        if aligned - start >= 2:
            end = aligned
        elif stop - end == 1:  # a budget under 2 * ALIGN (num_batch < 8): off the grid rather than never
            end -= 1
    if end - start < 2:
        return None
    assert start + 2 <= end <= stop and stop - end != 1
    return end


CHECKPOINT_STRIDE = 512
"""Tokens between the context checkpoints of a sliding-window model (:func:`swa_checkpoints`)."""
MAX_CHECKPOINTS = 4


def swa_checkpoints(n_prompt: int, stride: int = CHECKPOINT_STRIDE, most: int = MAX_CHECKPOINTS) -> tuple[int, ...]:
    """Extra save points for a sliding-window model's prompt: the last ``most`` multiples of ``stride`` below N-1.

    A sliding-window state holds only the in-window cells of its SWA layers,
    so it serves only whole, as an exact prefix: a later prompt that shares
    only part of it needs a state saved at or below the shared part. These are
    llama.cpp server's context checkpoints (``--ctx-checkpoints``), placed on
    the chunk grid so they change no chunk's bits.
    """
    assert stride % ALIGN == 0
    points = list(range(stride, n_prompt - 1, stride))
    return tuple(points[-most:])
