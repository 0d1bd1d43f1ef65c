"""Context shift on overflow (llama.cpp's ``--context-shift``) and prompt truncation.

Keep ``num_keep`` tokens, drop half of the rest. ``num_keep`` defaults to BOS plus the system prompt, at least 4
tokens (the "attention sinks" of StreamingLLM, Xiao et al. 2023). After a shift the slot's KV beyond the kept
prefix differs from a fresh prefill of the same tokens, so ``Slot.exact`` drops to the kept prefix. A model whose
positions cannot shift re-prefills the kept tokens plus the recent tail. A draft model's sequence is shifted too
(:meth:`~ollapy.engine.spec.speculator.Speculator.shift`).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ollapy.engine.slot import Slot, SlotState

if TYPE_CHECKING:
    from ollapy.engine.engine import Engine

log = logging.getLogger("ollapy.engine")

#: the most context shifts one request may take (then it ends with done_reason "length")
MAX_SHIFTS = 64


def make_room(engine: Engine, s: Slot) -> bool:
    """Free KV space in ``engine``'s full generating slot ``s``; False when the request was ended instead."""
    req = s.request
    if not req.options.shift or req.metrics.shifts >= MAX_SHIFTS:
        engine._finish(s, "length")
        return False
    n_keep = min(s.keep, len(s.tokens) - 2)
    n_discard = (len(s.tokens) - n_keep) // 2
    if req.media:  # never cut inside an image: keep all of one the kept prefix cuts, discard all of one the cut ends in
        n_keep = max(n_keep, next((sp.end for sp in req.media if sp.start < n_keep < sp.end), n_keep))
        n_discard = (len(s.tokens) - n_keep) // 2
        end = next((sp.end for sp in req.media if sp.start < n_keep + n_discard < sp.end), n_keep + n_discard)
        n_discard = min(end - n_keep, len(s.tokens) - n_keep - 1)
        if not b_can_shift(engine):  # re-prefilling would need the images again: end the answer instead
            engine._finish(s, "length")
            return False
    if n_discard <= 0:
        engine._finish(s, "length")
        return False
    req.metrics.shifts += 1
    b = engine.backend
    if b.can_shift:
        b.seq_rm(s.id, n_keep, n_keep + n_discard)
        b.seq_add(s.id, n_keep + n_discard, -1, -n_discard)
        del s.tokens[n_keep:n_keep + n_discard]
        s.exact = min(s.exact, n_keep)
        engine.spec.shift(s.id, n_keep, n_discard)
        if req.media:  # the images after the cut moved down; those inside it are gone
            from dataclasses import replace

            req.media = tuple(sp if sp.end <= n_keep else replace(sp, start=sp.start - n_discard)
                              for sp in req.media if sp.end <= n_keep or sp.start >= n_keep + n_discard)
        log.debug("slot %d: context shift, kept %d, discarded %d", s.id, n_keep, n_discard)
        return True
    # cannot shift positions: re-prefill the kept tokens plus the recent tail
    kept = s.tokens[:n_keep] + s.tokens[n_keep + n_discard:] + [s.pending]
    b.seq_clear(s.id)
    s.tokens = []
    s.exact = 0
    s.prompt = kept
    s.state = SlotState.PREFILL
    log.debug("slot %d: model cannot shift; re-prefilling %d tokens", s.id, len(kept))
    return True


def b_can_shift(engine: Engine) -> bool:
    """Whether ``engine``'s model shifts positions in place (``llama_memory_can_shift``)."""
    return bool(engine.backend.can_shift)


def truncate_prompt(tokens: list[int], keep: int, n_ctx: int) -> tuple[list[int], int]:
    """Cut a prompt that does not fit: keep the first ``keep`` tokens and the most recent tail.

    Leaves room for generation: the result is at most ``n_ctx // 2 + keep`` tokens
    (and always under ``n_ctx``). Returns ``(tokens, keep)``.
    """
    keep = min(keep, n_ctx // 4)
    room = max(1, n_ctx // 2)
    tail = tokens[-room:]
    return tokens[:keep] + tail, keep
