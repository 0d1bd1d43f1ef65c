"""The engine: one loaded model, ``n_parallel`` slots, continuous batching on one loop thread.

Design follows llama.cpp's server slot loop (``update_slots``), in the
canonical evaluation order of :mod:`ollapy.engine.prefix.evalorder`: every step
evaluates the next prompt chunk of each prefilling slot (each chunk in its own
``llama_decode``, up to ``n_batch`` prompt tokens per step: chunked prefill, so
a long prompt stalls other slots by a bounded amount), then ONE
``llama_decode`` of single rows: a decode token for every generating slot and
the last prompt token of every slot whose chunks are done. Only those rows ask
for logits; each slot samples from its own row with its own sampler chain.

Slot choice for a new request: :mod:`ollapy.engine.prefix.assignment` (one prefix
source per request: the slot's own KV, a donor slot's KV, or a prompt-cache
state). At least one prompt token is always evaluated, for fresh logits.

Context shift on overflow: :mod:`ollapy.engine.context_shift` (shifted KV is never reused past ``num_keep``
nor saved). ``Slot.exact`` also stops before decode-shaped cells (the last prompt token, generated tokens), except
on a build where they equal a chunk's (``answer_reuse``, evalorder rule 3): there a finished state keeps the answer.

Speculative decoding: :mod:`ollapy.engine.spec.speculator` proposes drafted tokens for generating slots; they ride
as extra rows of the same single ``llama_decode`` and are verified row by row with the slot's own sampler.

Per-slot bookkeeping (sampling a row, emitting a token, verifying drafts, finishing, failing, trimming and
saving a slot): :class:`~ollapy.engine.bookkeeping.SlotBookkeeping`, a base of :class:`Engine`.

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

from ollapy.engine.backend.context import Backend
from ollapy.engine.bookkeeping import SlotBookkeeping
from ollapy.engine.context_shift import make_room, truncate_prompt
from ollapy.engine.cpuload import ThreadBudget
from ollapy.engine.inflight import InflightBatch, cancelled_or
from ollapy.engine.media import clip_chunk_end, points_outside, span_at
from ollapy.engine.prefix.assignment import SlotAssigner
from ollapy.engine.prefix.evalorder import grid_for, grid_points, next_chunk_end, swa_checkpoints
from ollapy.engine.prefix.source import PrefixSource
from ollapy.engine.request import Request
from ollapy.engine.sampler import resolve_logit_bias
from ollapy.engine.slot import Slot, SlotState
from ollapy.engine.spec.draft_model import PendingTokens
from ollapy.engine.spec.speculator import Candidate, Speculator
from ollapy.errors import BusyError, Cancelled, ContextError, DecodeError, OllapyError
from ollapy.options import Options, predict_limit

if TYPE_CHECKING:
    import asyncio


log = logging.getLogger("ollapy.engine")

class Engine(SlotBookkeeping):
    """Serve generation requests over ``backend.n_parallel`` slots of one model.

    ``cache`` is an optional prompt cache, seen only through the
    :class:`~ollapy.engine.prefix.source.PrefixSource` Protocol.
    ``max_queue`` bounds the requests waiting for a slot; past it
    :meth:`submit` raises BusyError at once. A context manager: leaving the
    ``with`` block calls :meth:`close`.
    """

    def __init__(self, backend: Backend, *, max_queue: int = 512, cache: PrefixSource | None = None,
                 load_duration_ns: int = 0, speculator: Speculator | None = None, media=None) -> None:
        self.backend = backend
        self.media = media  # ollapy.engine.media.MediaPrompter of a vision model, else None
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
        self.kv_per_token = backend.kv_bytes_per_token()  # KV bytes per token of one slot (the planner's unit)
        self.align = grid_for(backend.n_swa)  # the canonical order's chunk grid (evalorder)
        # evalorder rule 3: on a build whose decode rows compute like chunk rows, generated cells are exact too, and
        # a reused prefix may end anywhere (the 4-grid is for repacked weights; a sliding-window state restores
        # its window in the cold run's lanes wherever it ends: backend/window.py)
        self.answer_reuse = bool(getattr(backend, "answer_reuse", False))
        self.reuse_align = 1 if self.answer_reuse else self.align
        self.unshifted = backend.n_swa if self.answer_reuse else 0  # a sliding-window state off its grid, still exact
        self.spec = speculator or Speculator(backend.n_parallel)  # speculative decoding (engine/speculation.py)
        # the decode in flight, stopped when every request in it was cancelled (engine/inflight.py)
        self.inflight = InflightBatch(getattr(backend, "abort_flag", None))
        self._assigner = SlotAssigner(self)  # a new request's slot and prefix source (engine/assignment.py)
        # fewer decode threads while other processes keep the CPUs busy (engine/cpuload.py); explicit num_thread: fixed
        self.thread_budget = ThreadBudget(getattr(backend, "threads", 1),
                                          adaptive=not getattr(getattr(backend, "cfg", None), "num_thread", 0))
        self.thread_budget.prime()
        if self.spec.draft_model is not None:  # the draft model's context decodes on the same CPUs, same budget
            self.spec.draft_model.thread_count = self.thread_budget.threads
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
               first: bool = False, pin: bool = False, truncated: bool = False, logprobs: int = -1,
               media: tuple = (), save_end: bool = True) -> Request:
        """Queue a generation of ``tokens``; return its :class:`Request` to read chunks from.

        An unset ``options.num_predict`` (negative) becomes the model's
        ``n_ctx_train`` (:func:`~ollapy.options.predict_limit`). Raises
        ContextError when the prompt does not fit ``num_ctx`` and
        ``options.truncate`` is false, BusyError when the queue is full, OptionError for a ``logit_bias`` token
        outside the vocabulary (its texts are tokenized here: :func:`~ollapy.engine.sampler.resolve_logit_bias`).
        ``media``: the prompt's image spans
        (:mod:`ollapy.engine.media`); a prompt with images that does not fit is a ContextError, never truncated.
        ``save_end`` False: only the save points reach the prompt cache, not the finished state.
        """
        if not tokens:
            raise ContextError("empty prompt", hint="give the model some text")
        tokens = list(tokens)
        n_ctx = self.num_ctx
        if media:
            n_img = sum(sp.n_tokens for sp in media)
            if self.media is None:
                raise ContextError("this model has no vision projector", hint="send images to a vision model")
            if len(tokens) >= n_ctx:
                raise ContextError(f"the prompt with its images is {len(tokens)} tokens ({n_img} of them image "
                                   f"embeddings) but the context holds {n_ctx}",
                                   hint="raise num_ctx or send fewer or smaller images")
        if len(tokens) >= n_ctx:
            if not options.truncate:
                raise ContextError(f"prompt is {len(tokens)} tokens but the context holds {n_ctx}",
                                   hint="raise num_ctx, shorten the prompt, or allow truncate")
            tokens, keep = truncate_prompt(tokens, self.resolve_keep(keep, options), n_ctx)
            truncated = True
        if options.logit_bias:  # texts tokenized, ids checked against the vocabulary (OptionError)
            options = replace(options, logit_bias=resolve_logit_bias(self.backend, options.logit_bias))
        limit = predict_limit(options.num_predict, getattr(self.backend, "n_ctx_train", 0))
        if limit != options.num_predict:  # unset num_predict: at most n_ctx_train tokens (runaway base models)
            options = replace(options, num_predict=limit)
        # every chunk starts on the grid (evalorder); an answer-reuse build needs none, and the end of the previous
        # turn, 2 tokens past the reused answer, stays a save point (the conversation is written through there)
        save_points = grid_points(save_points, self.reuse_align)
        if cache and self.cache is not None and self.backend.n_swa:  # context checkpoints (evalorder)
            save_points = tuple(sorted(set(save_points) | set(swa_checkpoints(len(tokens)))))
        if media:  # a saved state never ends inside an image
            save_points = points_outside(save_points, media)
        req = Request(tokens=tokens, options=options, grammar=grammar, keep=keep, cache=cache,
                      save_points=save_points, loop=loop, pin=pin, logprobs=logprobs, media=tuple(media),
                      save_end=save_end)
        req.metrics.truncated = truncated
        req.on_cancel = self.inflight.note_cancel
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
        """One engine step in the canonical evaluation order (:mod:`ollapy.engine.prefix.evalorder`).

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
            media = s.request.media
            span = span_at(media, start) if media else None
            if span is not None:  # an image chunk: its embeddings in one piece (engine/media.py)
                if self._decode_image(s, span):
                    budget -= span.n_tokens
                    if span.end in s.request.save_points:
                        self._save(s, pinned=s.request.pin, persist=True, interim=self._interim(s.request, span.end))
                continue
            # chunks end at save points with the cache off too: every run of this prompt has the same chunks
            end = next_chunk_end(start, stop, min(budget, n_ubatch), s.request.save_points, self.align)
            if end is None:
                continue
            if media:  # a text chunk ends where an image starts
                end = clip_chunk_end(start, end, media)
            if not self._decode_chunk(s, start, end):
                continue
            budget -= end - start
            if end in s.request.save_points:
                self._save(s, pinned=s.request.pin, persist=True, interim=self._interim(s.request, end))
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
        self.inflight.begin((s,))
        try:
            b.decode(toks, pos, seqs, want)
        except DecodeError as exc:
            b.seq_rm(s.id, len(s.tokens), -1)
            self._fail(s, cancelled_or(s, exc))
            return False
        finally:
            self.inflight.end()
        self.steps += 1
        exact = s.exact == len(s.tokens)
        s.tokens.extend(toks)
        if exact:  # chunk-shaped cells: what a cold prefill of a longer prompt computes too
            s.exact = len(s.tokens)
        assert b.seq_pos_max(s.id) + 1 == len(s.tokens), (s.id, len(s.tokens))
        return True

    def _decode_image(self, s: Slot, span) -> bool:
        """Encode the image chunk of ``span`` and decode its embeddings into ``s``; False if it failed."""
        try:
            embd, ns = self.media.embed(span)
            s.request.metrics.image_encode_duration += ns
            self._set_threads(span.n_tokens)
            self.media.decode(embd, span.start, s.id, span)
        except OllapyError as exc:
            self.backend.seq_rm(s.id, len(s.tokens), -1)
            self._fail(s, exc)
            return False
        self.steps += 1
        exact = s.exact == len(s.tokens)
        s.tokens.extend(s.prompt[span.start:span.end])
        if exact:  # the same embeddings in one decode in every run: exact like a prompt chunk
            s.exact = len(s.tokens)
        return True

    def _decode_rows(self, active: list[Slot]) -> None:
        """One ``llama_decode`` of single rows (decode tokens and last prompt tokens), each generating slot's
        followed by the tokens it drafted (:mod:`ollapy.engine.spec.speculator`), then sample (and verify) each."""
        b = self.backend
        toks, pos, seqs, want = array("i"), array("i"), array("i"), array("b")
        in_batch: list[Slot] = []
        drafts = self._plan_drafts(active) if self.spec.active else {}
        for s in active:
            if s.state is SlotState.FINISH:
                if len(s.tokens) + 1 > self.num_ctx:  # no cell left for it: end without it
                    self._finish(s, "length", last=s.pending)
                    continue
                tok = s.pending
            elif s.state is SlotState.GENERATE:
                if len(s.tokens) + 1 > self.num_ctx and not make_room(self, s):
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
        self.inflight.begin(in_batch)
        try:
            b.decode(toks, pos, seqs, want)
        except DecodeError as exc:
            for s in in_batch:
                b.seq_rm(s.id, len(s.tokens), -1)
                self._fail(s, cancelled_or(s, exc))
            return
        finally:
            self.inflight.end()
        if self.spec.active:
            self.spec.observe_step(len(toks), time.perf_counter() - t0)
            for s in in_batch:  # a draft model's prompt evaluation belongs to prompt processing, like the target's
                if s.state is SlotState.PREFILL and self.spec.uses_draft_model(s.id):
                    self.spec.sync_prompt(s.id, s.prompt)
        self.steps += 1
        now = time.perf_counter_ns()
        for s in in_batch:
            self._append_row(s, toks[s.batch_row])
            if s.state is SlotState.PREFILL:
                req = s.request
                if not s.t_first:
                    req.metrics.prompt_eval_duration = now - s.t_start
                    s.t_first = now
                    note = getattr(self.cache, "note_prefill", None)  # the remote tier's cost gate learns the rate
                    if note is not None:
                        note(len(req.tokens) - req.metrics.prompt_cache_tokens, (now - s.t_start) / 1e9)
                s.state = SlotState.GENERATE
            if s.state is SlotState.FINISH:  # its row's KV is kept; nothing more is sampled
                self._finish(s, "length")
            elif s.draft:
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
                # a view of the token list for a draft model, never a copy (an n-gram drafter keeps its own history)
                tokens = PendingTokens(s.tokens, s.pending) if self.spec.uses_draft_model(s.id) else ()
                decoding.append(Candidate(s.id, tokens, room))
            elif len(s.tokens) == len(s.prompt) - 1:
                others += 1
        if not decoding:
            return {}
        spare = self.backend.n_batch - len(decoding) - others
        per_slot = spare // len(decoding)
        decoding = [Candidate(c.slot, c.tokens, min(c.room, per_slot)) for c in decoding]
        return self.spec.plan(decoding, others)

    def _set_threads(self, n_tokens: int) -> None:
        b = self.backend
        n_threads = self.thread_budget.threads(n_tokens)
        if n_threads != b.threads:
            log.debug("decode threads %d -> %d (other runnable tasks on %d CPUs)", b.threads, n_threads,
                      self.thread_budget.n_cpu)
            b.set_threads(n_threads)

    # ---- slot assignment --------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.busy and s.request.cancelled and s.state is not SlotState.FINISH:  # FINISH ends this step
                s.request.cancelled_in = s.state.value
                self._fail(s, Cancelled("request cancelled"))
            elif s.busy and s.request.wrapping_up and s.state is SlotState.GENERATE:
                self._finish(s, "stop")  # the caller's own limit (Request.finish_early)
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
                self._assigner.start(req, idle)
            except OllapyError as exc:
                req.push(exc)
            except Exception as exc:  # noqa: BLE001
                log.exception("could not start request")
                req.push(DecodeError(f"could not start request: {exc}"))
