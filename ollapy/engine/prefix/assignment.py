"""Starting a request in a slot: plan its one prefix source, apply it, and begin its prefill.

Split out of :mod:`ollapy.engine.engine` (the step loop). :func:`~ollapy.engine.prefix.planner.plan_prefix` picks ONE
prefix source for a new request (the slot's own KV, a busy donor slot's KV copied in-context, or a
prompt-cache state) and :meth:`SlotAssigner.start` applies only that one, in the canonical evaluation order
of :mod:`ollapy.engine.prefix.evalorder` (a reused prefix resumes on the grid). Runs on the engine's loop thread.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ollapy.engine.media import floor_outside
from ollapy.engine.prefix.evalorder import canonical_reuse
from ollapy.engine.prefix.planner import MIN_GAIN, CacheOffer, Plan, SlotView, plan_prefix
from ollapy.engine.prefix.source import PrefixCandidate
from ollapy.engine.request import Request
from ollapy.engine.sampler import Sampler
from ollapy.engine.slot import Slot

if TYPE_CHECKING:
    from ollapy.engine.engine import Engine

log = logging.getLogger("ollapy.engine")


def persists_beyond(req: Request, reuse: int) -> bool:
    """True when ``req`` has a save point after its first ``reuse`` tokens while the cache is on for it.

    Save points are written to disk when the prefill reaches them, and each one's tokens extend the reused
    prefix, so a RAM-only state of that prefix need not be written first: one write of the longer state instead
    of two nearly alike (the previous turn's finished state, then the turn's end a few template tokens later).
    """
    return req.cache and any(p > reuse for p in req.save_points)


class SlotAssigner:
    """Puts waiting requests into idle slots of ``engine`` (its backend, slots, cache and speculator)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _views(self, holed: set[int] = frozenset()) -> list[SlotView]:
        """What the planner sees of each slot; a slot in ``holed`` offers no prefix (:meth:`_window_holed`)."""
        b = self.engine.backend
        return [SlotView(s.id, () if s.id in holed else s.usable, s.busy, s.last_used,
                         b.seq_pos_max(s.id) + 1 if s.busy else len(s.tokens)) for s in self.engine.slots]

    def _canonical(self, reuse: int, n_prompt: int) -> int:
        """:func:`canonical_reuse` on this engine's grid (1 on an answer-reuse build; evalorder rule 3)."""
        return canonical_reuse(reuse, n_prompt, self.engine.reuse_align, self.engine.unshifted)

    def window_holed(self, seq: int, reuse: int) -> bool:
        """True when a sliding-window model's ``seq`` trimmed to ``reuse`` would attend with holes.

        llama.cpp server's rule (``pos_min_thold``): the sliding-window cache of
        the sequence must still hold position ``reuse - n_swa``; a state
        restored from the cache holds only its in-window cells, and a trim
        below them leaves that cache empty (``seq_pos_min`` -1). The empty
        cells a restore puts before the window (``Backend.window_floor``) hold no KV.
        """
        b = self.engine.backend
        if not b.n_swa or not reuse:
            return False
        pos_min = b.seq_pos_min(seq)
        return pos_min < 0 or max(pos_min, b.window_floor(seq)) > max(0, reuse - b.n_swa)

    def _offer(self, prompt: list[int], exclude: set[str]) -> tuple[PrefixCandidate | None, CacheOffer | None]:
        if self.engine.cache is None:
            return None, None
        cand = self.engine.cache.peek(prompt, max_tokens=self.engine.num_ctx, exclude=exclude)
        if cand is None:
            return None, None
        return cand, CacheOffer(cand.n_tokens, cand.nbytes, cand.tier)

    def start(self, req: Request, idle: list[Slot]) -> None:
        """Plan the request's one prefix source (:func:`plan_prefix`), apply it, and start its prefill."""
        b = self.engine.backend
        prompt = req.tokens
        use_cache = self.engine.cache is not None and req.cache
        self.joined = 0  # KV blocks the cache restore read (shown by --verbose)
        excluded: set[str] = set()
        holed: set[int] = set()
        while True:
            cand, offer = self._offer(prompt, excluded) if use_cache else (None, None)
            plan = plan_prefix(prompt, self._views(holed), offer, num_ctx=self.engine.num_ctx,
                               kv_bytes_per_token=self.engine.kv_per_token)
            if plan.kind in ("slot", "copy"):
                src = plan.donor if plan.kind == "copy" else plan.slot
                if self.window_holed(src, self._canonical(plan.reuse, len(prompt))):
                    holed.add(src)  # its in-window cells do not reach down to the reuse point: plan again
                    continue
            if plan.kind == "cache" and b.n_swa and self._canonical(plan.reuse, len(prompt)) < cand.n_tokens:
                excluded.add(cand.name)  # a sliding-window state holds in-window cells only: never trimmed
                continue
            if cand is not None and plan.kind != "cache" and min(cand.n_tokens, len(prompt) - 1) - plan.reuse >= MIN_GAIN:
                excluded.add(cand.name)  # not worth its bytes: a shorter saved prefix (a smaller state) may be
                continue
            canon = self._canonical(plan.reuse, len(prompt))
            used = floor_outside(canon, req.media) if req.media else canon  # what the request keeps (below)
            if self._apply(plan, prompt, cand, promote=not persists_beyond(req, canon), n_used=used):
                break
            excluded.add(cand.name)  # unreadable or refused: plan again without it
        slot = self.engine.slots[plan.slot]
        reuse = self._canonical(plan.reuse, len(prompt))
        if req.media:  # a reused prefix never ends inside an image (engine/media.py)
            reuse = floor_outside(reuse, req.media)
        assert reuse <= len(slot.usable), (reuse, len(slot.usable), plan.kind)
        if not b.seq_rm(slot.id, reuse, -1):
            b.seq_clear(slot.id)
            reuse = 0
        if self.window_holed(slot.id, reuse):  # never attend with holes (a safety net: planned around above)
            b.seq_clear(slot.id)
            reuse = 0
        if use_cache and offer is None and not excluded and not reuse:  # a slot's own KV serving it is no miss
            self.engine.cache.record_miss()
        del slot.tokens[reuse:]
        slot.exact = len(slot.tokens)
        # seq_pos_max + 1 == len(tokens); not yet asserted for SWA models: after a Gemma checkpoint restore
        # llama.cpp reported an empty sequence for a slot holding 1024 tokens (test_cache_exactness, gemma_partial)
        slot.check(None if b.n_swa else b.seq_pos_max(slot.id) + 1)
        if use_cache and reuse and plan.kind in ("slot", "copy"):  # a RAM-only state of this prefix reaches the
            self.engine.cache.record_reuse(prompt, reuse, promote=not persists_beyond(req, reuse))  # disk
        req.metrics.prompt_eval_count = len(prompt)
        req.metrics.prompt_cache_tokens = reuse
        req.metrics.prefix_source = plan.source if reuse else "none"
        req.metrics.prompt_cache_blocks = self.joined if plan.kind == "cache" and reuse else 0
        req.planned.set()
        text_only = [t for t in prompt if t >= 0] if req.media else prompt  # no image placeholder ids
        slot.sampler = Sampler(b, req.options, req.grammar, text_only)
        slot.begin(req, self.engine.resolve_keep(req.keep, req.options))
        o = req.options
        draft = "" if req.media else o.draft  # a drafter never proposes an image's placeholder ids
        req.metrics.draft = self.engine.spec.begin(slot.id, prompt, draft, o.draft_num_predict, o.draft_min)
        log.debug("request %d -> slot %d: %d prompt tokens, %d reused (%s)", req.id, slot.id, len(prompt), reuse,
                  req.metrics.prefix_source)

    def _apply(self, plan: Plan, prompt: list[int], cand: PrefixCandidate | None, promote: bool = True,
               n_used: int | None = None) -> bool:
        """Make ``plan.slot`` hold the planned prefix source; False when a cache state could not be used.
        ``promote``: whether a restored RAM-only state is worth writing to disk now (:func:`persists_beyond`);
        ``n_used``: the tokens of a restored state the request keeps (counted by the cache's stats)."""
        b = self.engine.backend
        slot = self.engine.slots[plan.slot]
        if plan.kind == "copy":
            donor = self.engine.slots[plan.donor]
            b.seq_cp(donor.id, slot.id)  # cross-stream: buffers are copied at the next llama_decode
            slot.tokens = list(donor.tokens[:b.seq_pos_max(slot.id) + 1])
            slot.exact = min(donor.exact, len(slot.tokens))
        elif plan.kind == "cache":
            hit = self.engine.cache.load(cand, defer_check=True)  # a disk payload's checksum runs during state_set
            if hit is None:
                return False
            restored = b.state_set(slot.id, hit.load())  # llama.cpp returns 0 when the state cannot fit
            if not hit.verified():
                b.seq_clear(slot.id)  # restored from a file that failed its checksum: never used
                slot.tokens = []
                slot.exact = 0
                self.engine.cache.record_corrupt(hit)
                return False
            if not restored:
                slot.tokens = []
                slot.exact = 0
                self.engine.cache.record_refused(hit)
                return False
            slot.tokens = list(hit.tokens)
            slot.exact = len(slot.tokens)  # states are saved from exact cells only (_trim_inexact, _save)
            self.joined = getattr(hit, "n_blocks", 0)
            self.engine.cache.record_hit(hit, promote=promote, n_used=n_used)
        return True
