"""A generation request as the engine sees it, and the chunks it streams back.

A :class:`Request` is created by :meth:`ollapy.engine.Engine.submit`. The
engine's loop thread pushes :class:`Chunk` objects into it; the caller reads
them by iterating (``for chunk in req``) or, in asyncio code, with
``async for chunk in req`` when submitted with ``loop=``. ``cancel()`` may be
called from any thread: the slot is freed within one engine step.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ollapy.errors import Cancelled, OllapyError
from ollapy.options import Options

if TYPE_CHECKING:
    import asyncio


@dataclass
class Metrics:
    """Per-request timings in nanoseconds and token counts, with Ollama's names."""

    load_duration: int = 0
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    prompt_cache_tokens: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    total_duration: int = 0
    truncated: bool = False
    shifts: int = 0
    prefix_source: str = ""  # none, slot, copy, cache ram, cache disk (see ollapy.engine.prefix.planner)
    prompt_cache_blocks: int = 0  # KV blocks a prompt-cache restore read (0: none, or a state kept whole)
    draft: str = ""  # how the request drafted: "" (not), "ngram", "model" (ollapy.engine.spec.speculator)
    draft_tokens: int = 0  # drafted tokens verified
    draft_accepted: int = 0  # of them, accepted
    image_encode_duration: int = 0  # ns the projector spent encoding this request's images (not cached ones)

    def as_dict(self) -> dict[str, Any]:
        """The metrics as a dict of Ollama field names (plus ollapy's extras; the draft fields only when the
        request drafted)."""
        d = dict(self.__dict__)
        if not self.draft:
            for k in ("draft", "draft_tokens", "draft_accepted"):
                del d[k]
        if not self.image_encode_duration:
            del d["image_encode_duration"]
        if not self.prompt_cache_blocks:
            del d["prompt_cache_blocks"]
        return d


@dataclass
class TokenLogprob:
    """One generated token's log-probability under the model (natural log of the softmax of its raw logits,
    before any sampler), its bytes, and the ``top`` most likely alternatives as (piece, logprob, bytes)."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]] = field(default_factory=list)


@dataclass
class Chunk:
    """One streamed piece: ``text`` (may be ''), and on the last chunk ``done`` with ``done_reason`` and metrics.

    ``logprobs``: the requested :class:`TokenLogprob` of the tokens sampled since the previous chunk (None
    when the request did not ask for them). ``stop_sequence``: on the last chunk, the stop string that ended the
    answer (None when it ended otherwise)."""

    text: str
    done: bool = False
    done_reason: str | None = None
    metrics: Metrics | None = None
    tokens: list[int] | None = None
    logprobs: list[TokenLogprob] | None = None
    stop_sequence: str | None = None


@dataclass(frozen=True)
class Prompt:
    """Prompt tokens plus the positions the engine cares about.

    ``keep``: tokens of BOS + system prompt (protected on a context shift);
    ``save_points``: prefix lengths worth saving in the prompt cache; ``save_end`` False: the state a finished
    request leaves is not offered to the prompt cache (a code completion's: its tail is one keystroke's typed
    text and answer, which no later request starts with; its save point keeps the file's stable part).
    """

    tokens: list[int]
    keep: int
    save_points: tuple[int, ...]
    text: str
    truncated: bool = False
    media: tuple = ()  # ollapy.engine.media.MediaSpan per image chunk, in position order
    save_end: bool = True


@dataclass
class Request:
    """One generation: prompt tokens in, chunks out.

    ``tokens`` are the full prompt token ids; ``options`` the merged options;
    ``grammar`` an optional GBNF grammar; ``keep`` the number of leading
    tokens (BOS + system prompt) to protect on a context shift, or -1 for the
    default; ``cache`` False skips the prompt cache for this request; ``save_end`` False stores only the
    save points, not the state the finished request leaves (:class:`Prompt`).
    """

    tokens: list[int]
    options: Options
    grammar: str | None = None
    keep: int = -1
    cache: bool = True
    save_points: tuple[int, ...] = ()
    save_end: bool = True
    pin: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    logprobs: int = -1  # -1: none; n >= 0: each token's logprob and its n most likely alternatives
    media: tuple = ()  # ollapy.engine.media.MediaSpan per image chunk of ``tokens`` (placeholder ids there)
    id: int = 0
    created_ns: int = field(default_factory=time.perf_counter_ns)
    metrics: Metrics = field(default_factory=Metrics)
    output_tokens: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # sampled, not yet sent with a chunk
    on_cancel: Callable[[], None] | None = None  # the engine's hook: stops the decode in flight (engine/inflight.py)
    cancelled_in: str = ""  # the phase a cancel ended it in: queue, prefill or generate (an event for tests and logs)
    planned: threading.Event = field(default_factory=threading.Event)
    """Set once the engine has placed the request in a slot (``metrics.prompt_cache_tokens`` is then final, before
    the prefill) or ended it: what an API that reports the cache hit before the first token waits for."""
    _cancel: threading.Event = field(default_factory=threading.Event)
    _wrap_up: threading.Event = field(default_factory=threading.Event)
    _q: Any = None
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.loop is not None:
            import asyncio  # only servers pass a loop: the CLI never pays for importing asyncio

            self._q = asyncio.Queue()
        else:
            self._q = queue.SimpleQueue()

    # -- engine side ----------------------------------------------------------------------
    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The logprobs sampled since the last chunk (emptied), or None when the request wants none."""
        if self.logprobs < 0:
            return None
        out, self.pending_logprobs = self.pending_logprobs, []
        return out

    def push(self, item: Chunk | BaseException) -> None:
        """Deliver a chunk or a terminal exception to the reader (engine thread)."""
        if self._closed:
            return
        if isinstance(item, BaseException) or (isinstance(item, Chunk) and item.done):
            self._closed = True
            self.planned.set()
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._q.put_nowait, item)
            except RuntimeError:  # loop closed: the reader is gone
                self._cancel.set()
        else:
            self._q.put(item)

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancel.is_set()

    @property
    def wrapping_up(self) -> bool:
        """True once :meth:`finish_early` was called."""
        return self._wrap_up.is_set()

    # -- caller side ----------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the engine to stop this request; its slot is freed at once when its decode in flight holds no other
        request's rows (ollapy.engine.inflight), else within one step."""
        self._cancel.set()
        hook = self.on_cancel
        if hook is not None:
            hook()

    def finish_early(self) -> None:
        """Ask the engine to end this generating request as finished (``done_reason`` ``"stop"``, its final chunk
        with the metrics) at the next step, its slot freed there: a caller's own limit (``/infill``'s
        ``n_indent``) that still wants the figures. A request not yet generating goes on until it is."""
        self._wrap_up.set()

    def __iter__(self):
        while True:
            try:
                item = self._q.get(timeout=0.25)  # a timeout keeps Ctrl-C deliverable
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.done:
                return

    async def __aiter__(self):
        while True:
            item = await self._q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.done:
                return

    def result(self) -> tuple[str, Chunk]:
        """Read to the end; return (all text, final chunk). Raises the request's error."""
        parts = []
        last = None
        for c in self:
            parts.append(c.text)
            last = c
        assert last is not None
        return "".join(parts), last


def cancelled_error() -> OllapyError:
    """The error delivered to a cancelled request's reader."""
    return Cancelled("request cancelled")
