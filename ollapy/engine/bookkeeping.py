"""Per-slot bookkeeping of the engine: what happens to a slot's row after a decode, and how its request ends.

:class:`SlotBookkeeping` is a base class of :class:`~ollapy.engine.engine.Engine` (:mod:`ollapy.engine.engine`
builds each step's batches and runs the loop). Here, on the loop thread: a row's token is sampled with the slot's
own sampler chain (with its log-probability when asked), drafted rows are verified in order
(:mod:`ollapy.engine.spec.speculator`), a token is handed to the request (detokenized, stop strings, limits), and
a request that ends (finished, failed, cancelled) has its slot's inexact cells trimmed
(:mod:`ollapy.engine.prefix.evalorder`) and its exact state offered to the prompt cache before the slot is freed.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ollapy.engine.request import Chunk
from ollapy.engine.sampler import token_logprob
from ollapy.engine.slot import SlotState

if TYPE_CHECKING:
    from ollapy.engine.backend.context import Backend
    from ollapy.engine.prefix.source import PrefixSource
    from ollapy.engine.slot import Slot
    from ollapy.engine.spec.speculator import Speculator

log = logging.getLogger("ollapy.engine")


class SlotBookkeeping:
    """Sampling, emitting, verifying drafts and ending requests for :class:`~ollapy.engine.engine.Engine` (a base
    class: the attributes below are set by ``Engine.__init__``). Loop thread only."""

    backend: Backend
    cache: PrefixSource | None
    spec: Speculator
    answer_reuse: bool
    unshifted: int
    align: int
    reuse_align: int
    requests_done: int

    def _append_row(self, s: Slot, tok: int) -> None:
        """Record a decode-shaped cell (a last prompt token, a generated or an accepted drafted token) of ``s``.

        Exact (evalorder rule 3) only where :attr:`answer_reuse` holds and every cell before it is exact: a shifted
        context stays inexact.
        """
        if self.answer_reuse and s.exact == len(s.tokens):
            s.exact += 1
        s.tokens.append(tok)

    def _verify(self, s: Slot) -> None:
        """Sample a drafting slot's rows in order while they agree with its draft (verify_by_sampling), keep
        the KV of the accepted rows, and remove the rejected rows' cells with ``seq_rm``."""
        draft, req = s.draft, s.request
        req.metrics.draft_tokens += len(draft)
        n_acc = 0
        for i in range(len(draft) + 1):
            if i:
                self._append_row(s, draft[i - 1])  # row i's input: an accepted draft token, its KV now valid
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
            if self._keeps_answer(s):  # decode the last token first (one more row), so the state holds it
                s.pending, s.state, s.t_done = tok, SlotState.FINISH, time.perf_counter_ns()
            else:
                self._finish(s, "length", last=tok)
            return True
        s.pending = tok
        self.spec.accept(s.id, tok)
        return False

    def _keeps_answer(self, s: Slot) -> bool:
        """True when the state ``s`` leaves will be saved with its answer (answer reuse, the cache on for the
        request, every cell exact): then the token a ``num_predict`` cut leaves undecoded is worth one more decode
        row, or the next turn prefills it again. On a sliding-window model too: :meth:`_answer_end` then ends the
        state where the answer's text, rendered back, stops tokenizing the same (a word cut mid-way)."""
        return not (self.cache is None or not s.request.cache or not s.request.save_end or not self.answer_reuse
                    or s.exact < len(s.tokens))

    def _finish(self, s: Slot, reason: str, flush: bool = True, last: int = -1) -> None:
        """End ``s``'s request: its final chunk carries ``reason``, the metrics and the context (every prompt and
        output token: the slot's cells and ``last``, an output token no cell holds); the exact state is saved."""
        req = s.request
        tail = ""
        if flush:
            tail = s.detok.flush()
            emit, stopped = s.stops.feed(tail) if tail else ("", False)
            tail = emit + ("" if stopped else s.stops.flush())
        now = s.t_done or time.perf_counter_ns()  # a FINISH step's decode is not the answer's time
        m = req.metrics
        if s.t_first:
            m.eval_duration = now - s.t_first
        m.total_duration = now - req.created_ns + m.load_duration
        context = list(s.tokens) + ([last] if last >= 0 else [])
        matched = s.stops.matched if reason == "stop" and s.stops is not None else None
        self._trim_inexact(s)
        if req.save_end:  # a code completion's end is a keystroke's tail: its save point holds what stays
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
        if self.backend.n_swa:  # a sliding-window state serves only whole: it ends where a later prompt resumes
            if s.exact > self.unshifted:  # (evalorder: past the window, on the grid; anywhere on answer reuse)
                s.exact -= s.exact % self.reuse_align
            if self.answer_reuse:  # and where the answer, rendered back, still tokenizes the same
                s.exact = self._answer_end(s)
        if s.exact < len(s.tokens) and self.backend.seq_rm(s.id, s.exact, -1):
            del s.tokens[s.exact:]
        elif s.exact < len(s.tokens):  # llama.cpp cannot trim this sequence: nothing of it is reusable
            self.backend.seq_clear(s.id)
            s.tokens = []
            s.exact = 0

    def _answer_end(self, s: Slot) -> int:
        """Where a sliding-window state that holds an answer ends, never inside the prompt: such a state serves
        only whole (a later prompt must contain all of it), so it ends where the next turn's prompt still holds
        the same tokens. That is the longest prefix of the answer that tokenizes the same once its text is
        tokenized again (:meth:`_retokenized_end`: a word cut by ``num_predict``, or a spelling the model chose
        that is not the tokenizer's), then before the answer's last tokens whose text ends in whitespace (a chat
        template that trims the answer, Gemma's ``| trim``, renders it back without them)."""
        prompt = len(s.prompt)
        end = self._retokenized_end(s, prompt, s.exact)
        while end > prompt and self.backend.token_piece(s.tokens[end - 1])[-1:].isspace():
            end -= 1
        return end

    def _retokenized_end(self, s: Slot, prompt: int, end: int, reach: int = 64) -> int:
        """The end of the longest prefix of ``s.tokens[:end]`` whose text from the prompt's last control token on
        (``reach`` tokens back at most: llama.cpp tokenizes the text between two special tokens as one fragment,
        the answer together with the turn header's text) tokenizes to the same ids; at least ``prompt``."""
        b = self.backend
        if end <= prompt:
            return end
        start = prompt
        while start > max(0, prompt - reach) and b.token_piece(s.tokens[start - 1]):
            start -= 1
        held = s.tokens[start:end]
        text = b"".join(b.token_piece(t) for t in held).decode("utf-8", "replace")
        again = b.tokenize(text, add_special=False, parse_special=False)
        same = 0
        for x, y in zip(held, again):
            if x != y:
                break
            same += 1
        if same < len(held) and same and start + same < end:
            same -= 1  # the token before the first difference may be one the next tokenization merges on
        return max(prompt, start + same)

    def _fail(self, s: Slot, exc: BaseException) -> None:
        req = s.request
        self._trim_inexact(s)
        self.spec.end(s.id)
        s.release()
        req.push(exc)

    @staticmethod
    def _interim(req, end: int) -> bool:
        """True for a save point at ``end`` other than the one that ends the system prompt (the largest at or below
        ``req.keep``): a conversation's own point, which its next turn extends (the cache may defer its write)."""
        shared = max((p for p in req.save_points if p <= req.keep), default=0)
        return end != shared

    def _save(self, s: Slot, pinned: bool, persist: bool, interim: bool = False) -> None:
        """Offer the slot's state to the prompt cache (``persist``: write it to disk, not only RAM; ``interim``: a
        conversation's own save point, :meth:`_interim`)."""
        if self.cache is None or s.request is None or not s.request.cache or not s.tokens:
            return
        if s.exact < len(s.tokens):  # decode-shaped or shifted cells: never cached (see evalorder)
            return
        try:
            self.cache.store(list(s.tokens), lambda: self.backend.state_get(s.id), pinned=pinned, persist=persist,
                             state_size=lambda: self.backend.state_size(s.id), interim=interim)
        except Exception:  # noqa: BLE001 - a cache failure never fails a request
            log.exception("prompt cache store failed")
