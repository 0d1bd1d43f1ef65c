"""The engine: one loaded model, ``n_parallel`` slots, continuous batching on one loop thread.

Design follows llama.cpp's server slot loop (``update_slots``), in the
canonical evaluation order of :mod:`ollapy.engine.evalorder`: every step
evaluates the next prompt chunk of each prefilling slot (each chunk in its own
``llama_decode``, up to ``n_batch`` prompt tokens per step: chunked prefill, so
a long prompt stalls other slots by a bounded amount), then ONE
``llama_decode`` of single rows: a decode token for every generating slot and
the last prompt token of every slot whose chunks are done. Only those rows ask
for logits; each slot samples from its own row with its own sampler chain.

Slot choice for a new request: :func:`ollapy.engine.planner.plan_prefix`
picks ONE prefix source (the slot's own KV, a busy donor slot's KV copied
in-context, or a prompt-cache state) and :meth:`Engine._start` applies only
that one. At least one prompt token is always evaluated, for fresh logits.

Context shift on overflow (llama.cpp's ``--context-shift``; keep ``num_keep``
tokens, drop half of the rest). ``num_keep`` defaults to BOS plus the system
prompt, at least 4 tokens (the "attention sinks" of StreamingLLM, Xiao et al.
2023). Shifted KV and reuse: after a shift the slot's KV beyond the kept
``num_keep`` tokens differs from a fresh prefill of the same tokens (it was
computed with the discarded tokens in view), so a later request on that slot
reuses at most the kept prefix (``Slot.exact``), and shifted KV is never saved
to the prompt cache. Reuse therefore never puts KV into a slot that a fresh
prefill of the same tokens would not compute. The same holds bit for bit
because of the canonical evaluation order: ``Slot.exact`` also stops before
decode-shaped cells (the last prompt token, generated tokens).

Lifecycle: :meth:`Engine.close` stops the loop and joins its thread; only a
joined engine frees llama.cpp's context (a free under a running
``llama_decode`` crashes the process), so a join that times out leaks the
context on purpose and says so in the log.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from array import array
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import BusyError, Cancelled, ContextError, DecodeError, OllapyError
from ..options import Options, predict_limit
from .backend.context import Backend
from .cpuload import ThreadBudget
from .evalorder import canonical_reuse, grid_for, grid_points, next_chunk_end, swa_checkpoints
from .planner import MIN_GAIN, CacheOffer, Plan, SlotView, plan_prefix
from .prefix_source import PrefixCandidate, PrefixSource
from .request import Chunk, Request
from .sampler import Sampler, token_logprob
from .slot import Slot, SlotState
from .speculation import Candidate, Speculator

if TYPE_CHECKING:
    import asyncio


log = logging.getLogger("ollapy.engine")

MAX_SHIFTS = 64


class Engine:
    """Serve generation requests over ``backend.n_parallel`` slots of one model.

    ``cache`` is an optional prompt cache, seen only through the
    :class:`~ollapy.engine.prefix_source.PrefixSource` Protocol.
    ``max_queue`` bounds the requests waiting for a slot; past it
    :meth:`submit` raises BusyError at once. A context manager: leaving the
    ``with`` block calls :meth:`close`.
    """

    def __init__(self, backend: Backend, *, max_queue: int = 512, cache: PrefixSource | None = None,
                 load_duration_ns: int = 0, speculator: Speculator | None = None) -> None:
        self.backend = backend
        self.cache = cache
        self.max_queue = max_queue
        self.load_duration_ns = load_duration_ns
        self.slots = [Slot(i) for i in range(backend.n_parallel)]
        self._waiting: collections.deque[Request] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._next_id = 1
        self.steps = 0
        self.requests_done = 0
        self._kv_per_token = backend.kv_bytes_per_token()
        self.align = grid_for(backend.n_swa)  # the canonical order's chunk grid (evalorder)
        self.spec = speculator or Speculator(backend.n_parallel)  # speculative decoding (engine/speculation.py)
        # fewer decode threads while other processes keep the CPUs busy (engine/cpuload.py); explicit num_thread: fixed
        self.thread_budget = ThreadBudget(getattr(backend, "threads", 1),
                                          adaptive=not getattr(getattr(backend, "cfg", None), "num_thread", 0))
        self.thread_budget.prime()
        self._thread = threading.Thread(target=self._run, name="ollapy-engine", daemon=True)
        self._thread.start()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- public API -------------------------------------------------------------------------
    @property
    def num_ctx(self) -> int:
        """Context length per slot, in tokens."""
        return self.backend.num_ctx

    def submit(self, tokens: list[int], options: Options, *, grammar: str | None = None, keep: int = -1,
               cache: bool = True, save_points: tuple[int, ...] = (), loop: asyncio.AbstractEventLoop | None = None,
               first: bool = False, pin: bool = False, truncated: bool = False, logprobs: int = -1) -> Request:
        """Queue a generation of ``tokens``; return its :class:`Request` to read chunks from.

        An unset ``options.num_predict`` (negative) becomes the model's
        ``n_ctx_train`` (:func:`~ollapy.options.predict_limit`). Raises
        ContextError when the prompt does not fit ``num_ctx`` and
        ``options.truncate`` is false, BusyError when the queue is full.
        """
        if not tokens:
            raise ContextError("empty prompt", hint="give the model some text")
        tokens = list(tokens)
        n_ctx = self.num_ctx
        if len(tokens) >= n_ctx:
            if not options.truncate:
                raise ContextError(f"prompt is {len(tokens)} tokens but the context holds {n_ctx}",
                                   hint="raise num_ctx, shorten the prompt, or allow truncate")
            tokens, keep = truncate_prompt(tokens, self.resolve_keep(keep, options), n_ctx)
            truncated = True
        limit = predict_limit(options.num_predict, getattr(self.backend, "n_ctx_train", 0))
        if limit != options.num_predict:  # unset num_predict: at most n_ctx_train tokens (runaway base models)
            options = replace(options, num_predict=limit)
        save_points = grid_points(save_points, self.align)  # every chunk starts on the grid (evalorder)
        if cache and self.cache is not None and self.backend.n_swa:  # context checkpoints (evalorder)
            save_points = tuple(sorted(set(save_points) | set(swa_checkpoints(len(tokens)))))
        req = Request(tokens=tokens, options=options, grammar=grammar, keep=keep, cache=cache,
                      save_points=save_points, loop=loop, pin=pin, logprobs=logprobs)
        req.metrics.truncated = truncated
        # like Ollama, only the request that caused the load reports it
        req.metrics.load_duration, self.load_duration_ns = self.load_duration_ns, 0
        with self._cv:
            if self._stop:
                raise OllapyError("engine is shut down", hint="load the model again")
            if len(self._waiting) >= self.max_queue + self._free_slots():
                raise BusyError(f"server busy: {len(self._waiting)} requests already waiting",
                                hint="retry later or raise OLLAPY_MAX_QUEUE / num_parallel")
            req.id = self._next_id
            self._next_id += 1
            if first:
                self._waiting.appendleft(req)
            else:
                self._waiting.append(req)
            self._cv.notify()
        return req

    def resolve_keep(self, keep: int, options: Options) -> int:
        """Tokens protected on a shift: ``options.num_keep`` if set, else ``keep`` (BOS + system), at least 4."""
        if options.num_keep >= 0:
            k = options.num_keep
        else:
            k = max(4, keep)
        # a keep that nearly fills the window could never free space: clamp to half the context
        return min(k, self.num_ctx // 2)

    def stats(self) -> dict:
        """Slots busy, queue depth, steps and requests served."""
        return {
            "slots": len(self.slots),
            "slots_busy": sum(s.busy for s in self.slots),
            "queue_depth": len(self._waiting),
            "steps": self.steps,
            "requests_done": self.requests_done,
            "draft": self.spec.draft_name,
            "draft_tokens": self.spec.drafted,
            "draft_accepted": self.spec.accepted,
        }

    def stop(self, timeout: float = 60) -> bool:
        """Stop the loop (cancelling active and waiting requests) and join its thread; True once joined.

        Idempotent. A Ctrl-C while waiting is deferred until the join ends:
        the caller must not free the context under a running decode.
        """
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is threading.current_thread():
            return False
        end = time.monotonic() + timeout
        interrupted = False
        while self._thread.is_alive() and time.monotonic() < end:
            try:
                self._thread.join(timeout=min(0.25, max(0.0, end - time.monotonic())))
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            if self._thread.is_alive():
                log.warning("engine loop did not stop; the llama.cpp context is leaked, not freed")
            raise KeyboardInterrupt
        return not self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        """True once the loop thread has ended."""
        return not self._thread.is_alive()

    def close(self, timeout: float = 60) -> None:
        """Stop and join the loop, then free the backend; a loop that does not end in time leaks it (logged)."""
        if self.stop(timeout):
            self.backend.close()
        else:
            log.warning("engine loop still running after %.0f s; the llama.cpp context is leaked, not freed", timeout)

    # ---- loop ---------------------------------------------------------------------------------
    def _free_slots(self) -> int:
        return sum(not s.busy for s in self.slots)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not any(s.busy for s in self.slots):
                    self._cv.wait()
                if self._stop:
                    break
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - the loop must survive anything
                log.exception("engine step failed")
                for s in self.slots:
                    if s.busy:
                        self._fail(s, exc if isinstance(exc, OllapyError) else DecodeError(f"engine error: {exc}"))
        for s in self.slots:
            if s.busy:
                self._fail(s, Cancelled("model unloaded"))
        with self._cv:
            while self._waiting:
                self._waiting.popleft().push(Cancelled("model unloaded"))

    def _step(self) -> None:
        """One engine step in the canonical evaluation order (:mod:`ollapy.engine.evalorder`).

        First each prefilling slot's next chunk of ``[0, N-1)``, each in its own
        ``llama_decode`` (up to ``n_batch`` prompt tokens per step in all), then
        ONE ``llama_decode`` of single rows: a decode token for every
        generating slot and the last prompt token of every slot whose chunks
        are done. Only the single rows ask for logits.
        """
        self._drop_cancelled()
        self._assign_waiting()
        active = [s for s in self.slots if s.busy]
        if not active:
            return
        b = self.backend
        budget = b.n_batch
        n_ubatch = b.n_ubatch
        for s in sorted((s for s in active if s.state is SlotState.PREFILL), key=lambda s: s.request.id):
            if budget < 2:
                break
            start, stop = len(s.tokens), len(s.prompt) - 1
            if start >= stop:
                continue  # only the last prompt token is left: it goes with the single rows
            # chunks end at save points with the cache off too: every run of this prompt has the same chunks
            end = next_chunk_end(start, stop, min(budget, n_ubatch), s.request.save_points, self.align)
            if end is None:
                continue
            if not self._decode_chunk(s, start, end):
                continue
            budget -= end - start
            if end in s.request.save_points:
                self._save(s, pinned=s.request.pin, persist=True)
        self._decode_rows([s for s in self.slots if s.busy])

    def _decode_chunk(self, s: Slot, start: int, end: int) -> bool:
        """Evaluate prompt tokens ``[start, end)`` of slot ``s`` alone in one ``llama_decode``; False if it failed."""
        b = self.backend
        n = end - start
        toks = array("i", s.prompt[start:end])
        pos = array("i", range(start, end))
        seqs = array("i", [s.id]) * n
        want = array("b", [0]) * n
        self._set_threads(n)
        try:
            b.decode(toks, pos, seqs, want)
        except DecodeError as exc:
            b.seq_rm(s.id, len(s.tokens), -1)
            self._fail(s, exc)
            return False
        self.steps += 1
        exact = s.exact == len(s.tokens)
        s.tokens.extend(toks)
        if exact:  # chunk-shaped cells: what a cold prefill of a longer prompt computes too
            s.exact = len(s.tokens)
        assert b.seq_pos_max(s.id) + 1 == len(s.tokens), (s.id, len(s.tokens))
        return True

    def _decode_rows(self, active: list[Slot]) -> None:
        """One ``llama_decode`` of single rows (decode tokens and last prompt tokens), each generating slot's
        followed by the tokens it drafted (:mod:`ollapy.engine.speculation`), then sample (and verify) each."""
        b = self.backend
        toks, pos, seqs, want = array("i"), array("i"), array("i"), array("b")
        in_batch: list[Slot] = []
        drafts = self._plan_drafts(active) if self.spec.active else {}
        for s in active:
            if s.state is SlotState.GENERATE:
                if len(s.tokens) + 1 > self.num_ctx and not self._make_room(s):
                    continue
                if s.state is not SlotState.GENERATE:  # re-prefill after a non-shiftable overflow
                    continue
                tok = s.pending
            elif len(s.tokens) == len(s.prompt) - 1:
                tok = s.prompt[-1]
            else:
                continue
            s.batch_row = len(toks)
            s.draft = drafts.get(s.id, [])
            for i, t in enumerate([tok, *s.draft]):
                toks.append(t)
                pos.append(len(s.tokens) + i)
                seqs.append(s.id)
                want.append(1)
            in_batch.append(s)
        if not toks:
            return
        self._set_threads(len(toks))
        t0 = time.perf_counter()
        try:
            b.decode(toks, pos, seqs, want)
        except DecodeError as exc:
            for s in in_batch:
                b.seq_rm(s.id, len(s.tokens), -1)
                self._fail(s, exc)
            return
        if self.spec.active:
            self.spec.observe_step(len(toks), time.perf_counter() - t0)
        self.steps += 1
        now = time.perf_counter_ns()
        for s in in_batch:
            s.tokens.append(toks[s.batch_row])  # a decode-shaped cell: never counted in s.exact
            if s.state is SlotState.PREFILL:
                req = s.request
                if not s.t_first:
                    req.metrics.prompt_eval_duration = now - s.t_start
                    s.t_first = now
                s.state = SlotState.GENERATE
            if s.draft:
                self._verify(s)
            else:
                self._emit(s, self._sample(s, s.batch_row))

    def _plan_drafts(self, active: list[Slot]) -> dict[int, list[int]]:
        """Ask the speculator what each generating slot verifies in this step (rows fit ``n_batch``)."""
        decoding, others = [], 0
        for s in active:
            if s.state is SlotState.GENERATE:
                req = s.request
                limit = req.options.num_predict
                room = self.num_ctx - len(s.tokens) - 1  # the pending token's cell, then the drafted ones
                if limit >= 0:
                    room = min(room, limit - req.metrics.eval_count - 1)
                decoding.append(Candidate(s.id, s.tokens + [s.pending], room))
            elif len(s.tokens) == len(s.prompt) - 1:
                others += 1
        if not decoding:
            return {}
        spare = self.backend.n_batch - len(decoding) - others
        per_slot = spare // len(decoding)
        decoding = [Candidate(c.slot, c.tokens, min(c.room, per_slot)) for c in decoding]
        return self.spec.plan(decoding, others)

    def _verify(self, s: Slot) -> None:
        """Sample a drafting slot's rows in order while they agree with its draft (verify_by_sampling), keep
        the KV of the accepted rows, and remove the rejected rows' cells with ``seq_rm``."""
        draft, req = s.draft, s.request
        req.metrics.draft_tokens += len(draft)
        n_acc = 0
        for i in range(len(draft) + 1):
            if i:
                s.tokens.append(draft[i - 1])  # row i's input: an accepted draft token, its KV now valid
            tok = self._sample(s, s.batch_row + i)
            agrees = i < len(draft) and tok == draft[i]
            if agrees:
                n_acc += 1
                req.metrics.draft_accepted += 1
            if self._emit(s, tok) or not agrees:
                break
        self.spec.record(s.id, len(draft), n_acc)
        if s.request is req:  # still running: drop the rejected rows (a finished request was trimmed)
            self.backend.seq_rm(s.id, len(s.tokens), -1)

    def _set_threads(self, n_tokens: int) -> None:
        b = self.backend
        n_threads = self.thread_budget.threads(n_tokens)
        if n_threads != b.threads:
            log.debug("decode threads %d -> %d (other runnable tasks on %d CPUs)", b.threads, n_threads,
                      self.thread_budget.n_cpu)
            b.set_threads(n_threads)

    def _sample(self, s: Slot, row: int) -> int:
        """Sample (and accept into the slot's sampler) a token from logits row ``row``; note its logprob."""
        b = self.backend
        req = s.request
        tok = s.sampler.sample(b, row)
        if req.logprobs >= 0 and not b.is_eog(tok):
            req.pending_logprobs.append(token_logprob(b, row, tok, req.logprobs))
        return tok

    def _emit(self, s: Slot, tok: int) -> bool:
        """Hand a sampled token to the request (text, stop strings, limits); True when the request ended."""
        b = self.backend
        req = s.request
        limit = req.options.num_predict
        if limit >= 0 and req.metrics.eval_count >= limit:
            self._finish(s, "length")
            return True
        if b.is_eog(tok):
            self._finish(s, "stop")
            return True
        req.output_tokens.append(tok)
        req.metrics.eval_count += 1
        text = s.detok.feed(b.token_piece(tok))
        emit, stopped = s.stops.feed(text) if text else ("", False)
        if emit:
            req.push(Chunk(emit, logprobs=req.take_logprobs()))
        if stopped:
            self._finish(s, "stop", flush=False)
            return True
        if limit >= 0 and req.metrics.eval_count >= limit:
            self._finish(s, "length")
            return True
        s.pending = tok
        self.spec.accept(s.id, tok)
        return False

    # ---- slot assignment --------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.busy and s.request.cancelled:
                s.request.cancelled_in = s.state.value
                self._fail(s, Cancelled("request cancelled"))
        if not self._waiting:  # the common case, read without the lock: submit() only appends
            return
        with self._cv:
            if any(r.cancelled for r in self._waiting):
                keep = collections.deque()
                for r in self._waiting:
                    if r.cancelled:
                        r.cancelled_in = "queue"
                        r.push(Cancelled("request cancelled"))
                    else:
                        keep.append(r)
                self._waiting = keep

    def _assign_waiting(self) -> None:
        while self._waiting:  # read without the lock first: most steps have nothing waiting
            idle = [s for s in self.slots if not s.busy]
            if not idle:
                return
            with self._cv:
                if not self._waiting:
                    return
                req = self._waiting.popleft()
            try:
                self._start(req, idle)
            except OllapyError as exc:
                req.push(exc)
            except Exception as exc:  # noqa: BLE001
                log.exception("could not start request")
                req.push(DecodeError(f"could not start request: {exc}"))

    def _views(self, holed: set[int] = frozenset()) -> list[SlotView]:
        """What the planner sees of each slot; a slot in ``holed`` offers no prefix (:meth:`_window_holed`)."""
        b = self.backend
        return [SlotView(s.id, () if s.id in holed else s.usable, s.busy, s.last_used,
                         b.seq_pos_max(s.id) + 1 if s.busy else len(s.tokens)) for s in self.slots]

    def _window_holed(self, seq: int, reuse: int) -> bool:
        """True when a sliding-window model's ``seq`` trimmed to ``reuse`` would attend with holes.

        llama.cpp server's rule (``pos_min_thold``): the sliding-window cache of
        the sequence must still hold position ``reuse - n_swa``; a state
        restored from the cache holds only its in-window cells, and a trim
        below them leaves that cache empty (``seq_pos_min`` -1).
        """
        b = self.backend
        if not b.n_swa or not reuse:
            return False
        pos_min = b.seq_pos_min(seq)
        return pos_min < 0 or pos_min > max(0, reuse - b.n_swa)

    def _offer(self, prompt: list[int], exclude: set[str]) -> tuple[PrefixCandidate | None, CacheOffer | None]:
        if self.cache is None:
            return None, None
        cand = self.cache.peek(prompt, max_tokens=self.num_ctx, exclude=exclude)
        if cand is None:
            return None, None
        return cand, CacheOffer(cand.n_tokens, cand.nbytes, cand.tier)

    def _start(self, req: Request, idle: list[Slot]) -> None:
        """Plan the request's one prefix source (:func:`plan_prefix`), apply it, and start its prefill."""
        b = self.backend
        prompt = req.tokens
        use_cache = self.cache is not None and req.cache
        excluded: set[str] = set()
        holed: set[int] = set()
        while True:
            cand, offer = self._offer(prompt, excluded) if use_cache else (None, None)
            plan = plan_prefix(prompt, self._views(holed), offer, num_ctx=self.num_ctx,
                               kv_bytes_per_token=self._kv_per_token)
            if plan.kind in ("slot", "copy"):
                src = plan.donor if plan.kind == "copy" else plan.slot
                if self._window_holed(src, canonical_reuse(plan.reuse, len(prompt), self.align)):
                    holed.add(src)  # its in-window cells do not reach down to the reuse point: plan again
                    continue
            if plan.kind == "cache" and b.n_swa and canonical_reuse(plan.reuse, len(prompt), self.align) < cand.n_tokens:
                excluded.add(cand.name)  # a sliding-window state holds in-window cells only: never trimmed
                continue
            if cand is not None and plan.kind != "cache" and min(cand.n_tokens, len(prompt) - 1) - plan.reuse >= MIN_GAIN:
                excluded.add(cand.name)  # not worth its bytes: a shorter saved prefix (a smaller state) may be
                continue
            if self._apply(plan, prompt, cand):
                break
            excluded.add(cand.name)  # unreadable or refused: plan again without it
        if use_cache and offer is None and not excluded:
            self.cache.record_miss()
        slot = self.slots[plan.slot]
        reuse = canonical_reuse(plan.reuse, len(prompt), self.align)
        assert reuse <= len(slot.usable), (reuse, len(slot.usable), plan.kind)
        if not b.seq_rm(slot.id, reuse, -1):
            b.seq_clear(slot.id)
            reuse = 0
        if self._window_holed(slot.id, reuse):  # never attend with holes (a safety net: planned around above)
            b.seq_clear(slot.id)
            reuse = 0
        del slot.tokens[reuse:]
        slot.exact = len(slot.tokens)
        # seq_pos_max + 1 == len(tokens); not yet asserted for SWA models: after a Gemma checkpoint restore
        # llama.cpp reported an empty sequence for a slot holding 1024 tokens (test_cache_exactness, gemma_partial)
        slot.check(None if b.n_swa else b.seq_pos_max(slot.id) + 1)
        req.metrics.prompt_eval_count = len(prompt)
        req.metrics.prompt_cache_tokens = reuse
        req.metrics.prefix_source = plan.source if reuse else "none"
        slot.sampler = Sampler(b, req.options, req.grammar, prompt)
        slot.begin(req, self.resolve_keep(req.keep, req.options))
        o = req.options
        req.metrics.draft = self.spec.begin(slot.id, prompt, o.draft, o.draft_num_predict, o.draft_min)
        log.debug("request %d -> slot %d: %d prompt tokens, %d reused (%s)", req.id, slot.id, len(prompt), reuse,
                  req.metrics.prefix_source)

    def _apply(self, plan: Plan, prompt: list[int], cand: PrefixCandidate | None) -> bool:
        """Make ``plan.slot`` hold the planned prefix source; False when a cache state could not be used."""
        b = self.backend
        slot = self.slots[plan.slot]
        if plan.kind == "copy":
            donor = self.slots[plan.donor]
            b.seq_cp(donor.id, slot.id)  # cross-stream: buffers are copied at the next llama_decode
            slot.tokens = list(donor.tokens[:b.seq_pos_max(slot.id) + 1])
            slot.exact = min(donor.exact, len(slot.tokens))
        elif plan.kind == "cache":
            hit = self.cache.load(cand, defer_check=True)  # a disk payload's checksum runs during state_set
            if hit is None:
                return False
            restored = b.state_set(slot.id, hit.load())  # llama.cpp returns 0 when the state cannot fit
            if not hit.verified():
                b.seq_clear(slot.id)  # restored from a file that failed its checksum: never used
                slot.tokens = []
                slot.exact = 0
                self.cache.record_corrupt(hit)
                return False
            if not restored:
                slot.tokens = []
                slot.exact = 0
                self.cache.record_refused(hit)
                return False
            slot.tokens = list(hit.tokens)
            slot.exact = len(slot.tokens)  # states are saved from exact cells only (_trim_inexact, _save)
            self.cache.record_hit(hit)
        return True

    # ---- ending and saving ------------------------------------------------------------------
    def _finish(self, s: Slot, reason: str, flush: bool = True) -> None:
        req = s.request
        tail = ""
        if flush:
            tail = s.detok.flush()
            emit, stopped = s.stops.feed(tail) if tail else ("", False)
            tail = emit + ("" if stopped else s.stops.flush())
        now = time.perf_counter_ns()
        m = req.metrics
        if s.t_first:
            m.eval_duration = now - s.t_first
        m.total_duration = now - req.created_ns + m.load_duration
        context = list(s.tokens)
        matched = s.stops.matched if reason == "stop" and s.stops is not None else None
        self._trim_inexact(s)
        self._save(s, pinned=req.pin, persist=req.pin)
        self.spec.end(s.id)
        s.release()
        self.requests_done += 1
        req.push(Chunk(tail, done=True, done_reason=reason, metrics=m, tokens=context,
                       logprobs=req.take_logprobs(), stop_sequence=matched))

    def _trim_inexact(self, s: Slot) -> None:
        """Drop the cells no later request may reuse (``tokens[exact:]``: decode-shaped or shifted).

        Keeps ``tokens`` equal to the cells the sequence holds, and makes the
        state a finished request leaves exactly its reusable prefix.
        """
        if self.backend.n_swa:  # a sliding-window state is saved whole: it must end on the grid (evalorder)
            s.exact -= s.exact % self.align
        if s.exact < len(s.tokens) and self.backend.seq_rm(s.id, s.exact, -1):
            del s.tokens[s.exact:]
        elif s.exact < len(s.tokens):  # llama.cpp cannot trim this sequence: nothing of it is reusable
            self.backend.seq_clear(s.id)
            s.tokens = []
            s.exact = 0

    def _fail(self, s: Slot, exc: BaseException) -> None:
        req = s.request
        self._trim_inexact(s)
        self.spec.end(s.id)
        s.release()
        req.push(exc)

    def _save(self, s: Slot, pinned: bool, persist: bool) -> None:
        """Offer the slot's state to the prompt cache (``persist``: write it to disk, not only RAM)."""
        if self.cache is None or s.request is None or not s.request.cache or not s.tokens:
            return
        if s.exact < len(s.tokens):  # decode-shaped or shifted cells: never cached (see evalorder)
            return
        try:
            self.cache.store(list(s.tokens), lambda: self.backend.state_get(s.id), pinned=pinned, persist=persist)
        except Exception:  # noqa: BLE001 - a cache failure never fails a request
            log.exception("prompt cache store failed")

    # ---- context shift ----------------------------------------------------------------------
    def _make_room(self, s: Slot) -> bool:
        """Free KV space in a full generating slot; False when the request was ended instead."""
        req = s.request
        if not req.options.shift or req.metrics.shifts >= MAX_SHIFTS:
            self._finish(s, "length")
            return False
        n_keep = min(s.keep, len(s.tokens) - 2)
        n_discard = (len(s.tokens) - n_keep) // 2
        if n_discard <= 0:
            self._finish(s, "length")
            return False
        req.metrics.shifts += 1
        b = self.backend
        if b.can_shift:
            b.seq_rm(s.id, n_keep, n_keep + n_discard)
            b.seq_add(s.id, n_keep + n_discard, -1, -n_discard)
            del s.tokens[n_keep:n_keep + n_discard]
            s.exact = min(s.exact, n_keep)
            self.spec.shift(s.id, n_keep, n_discard)
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


def truncate_prompt(tokens: list[int], keep: int, n_ctx: int) -> tuple[list[int], int]:
    """Cut a prompt that does not fit: keep the first ``keep`` tokens and the most recent tail.

    Leaves room for generation: the result is at most ``n_ctx // 2 + keep`` tokens
    (and always under ``n_ctx``). Returns ``(tokens, keep)``.
    """
    keep = min(keep, n_ctx // 4)
    room = max(1, n_ctx // 2)
    tail = tokens[-room:]
    return tokens[:keep] + tail, keep
