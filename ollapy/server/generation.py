"""Shared by the Ollama and OpenAI routes: start a generation on the runtime and stream its chunks.

:func:`start` resolves and loads the model, builds the prompt and submits it
with ``loop=`` so chunks arrive on the event loop without blocking. Both run
on the model's own executor with a timeout (:meth:`ollapy.server.scheduler.Runtime.call`):
template rendering, tokenizing and JSON-schema grammar compilation take time on
long inputs, and a runner child may be stopped. Errors before the first byte (unknown model, bad options, busy)
propagate as exceptions and become status codes; :class:`Generation` always
cancels its request and releases the model in ``close()``, which every
response calls in a ``finally`` (client gone mid-stream or mid-prefill:
the slot is freed within one engine step).
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
import weakref
from typing import Any, AsyncIterator

from ollapy.chat import generic_tools
from ollapy.chat.answer_memory import written_history
from ollapy.chat.reply import ReplyDelta, ReplyParser, check_capabilities, forced_call_schema, tool_names
from ollapy.chat.thinking import prompt_opens_thinking, think_enabled
from ollapy.chat.toolcalls import detect_family
from ollapy.engine.media import check_count, decode_base64_image
from ollapy.errors import ContextOverflow, ImageError, OptionError
from ollapy.options import api_options

log = logging.getLogger("ollapy.server")


def now_iso() -> str:
    """Ollama's ``created_at``: RFC 3339 UTC with a ``Z``."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def model_messages(ref, messages: list[dict]) -> list[dict]:
    """Apply a model's SYSTEM and MESSAGE lines to a chat, as Ollama does.

    The model's system prompt is used only when the chat has none; the
    model's messages come after the leading system messages.
    """
    msgs = [_clean_message(m) for m in messages]
    lead = 0
    while lead < len(msgs) and msgs[lead]["role"] == "system":
        lead += 1
    head = msgs[:lead]
    if not head and getattr(ref, "system", None):
        head = [{"role": "system", "content": ref.system}]
    return head + [dict(m) for m in (getattr(ref, "messages", None) or [])] + msgs[lead:]


def _clean_message(m: Any) -> dict:
    if not isinstance(m, dict):
        raise OptionError("each message must be an object with role and content")
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise OptionError(f"invalid message role {role!r}", hint="use system, user, assistant or tool")
    content = m.get("content")
    if content is None:
        content = ""
    images: list[bytes] = []
    if isinstance(content, list):  # OpenAI content parts (image_url), Responses' (input_image), Anthropic's (image)
        from ollapy.server.content import read_parts

        content, images = read_parts(content, "content")
    if not isinstance(content, str):
        raise OptionError("message content must be a string")
    if m.get("images"):  # Ollama's base64 strings
        if not isinstance(m["images"], list):
            raise ImageError("images must be a list of base64 strings")
        images.extend(decode_base64_image(x, f"image {i + 1}") if isinstance(x, str) else _not_b64(x)
                      for i, x in enumerate(m["images"]))
    out = {"role": role, "content": content}
    if images:
        check_count(len(images))
        out["images"] = images
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]  # checked by bodies.read_history
    thinking = m.get("thinking") or m.get("reasoning_content") or m.get("reasoning")
    if role == "assistant" and isinstance(thinking, str) and thinking:
        out["thinking"] = thinking
    if role == "tool":
        for key in ("tool_call_id", "tool_name"):
            if isinstance(m.get(key), str) and m[key]:
                out[key] = m[key]
    return out


def _not_b64(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    raise ImageError("each image must be a base64 string", hint="send the image file's bytes base64-encoded")


LIVE: weakref.WeakSet[Generation] = weakref.WeakSet()
"""Every generation not yet garbage: what :func:`cancel_all` ends when the server shuts down."""


def cancel_all() -> int:
    """Cancel every unfinished generation (the engine ends each within one step; its stream then ends with an
    error line, so a shutting-down server's connections close instead of being cut). Returns how many."""
    n = 0
    for gen in list(LIVE):
        if not gen.finished and not gen.closed:
            gen.req.cancel()
            n += 1
    return n


class Generation:
    """A running request: ``chunks()`` yields engine chunks; ``close()`` cancels (if unfinished) and releases."""

    def __init__(self, state, entry, req, load_ns: int, t0: float, route: str, reply: ReplyParser | None = None) -> None:
        LIVE.add(self)
        self.reply = reply or ReplyParser()  # splits the text into thinking, content and tool calls
        self.state = state
        self.entry = entry
        self.req = req
        self.load_ns = load_ns
        self.t0 = t0
        self.route = route
        self.model = entry.key
        self.finished = False
        self.closed = False
        self.first_token_s: float | None = None
        self.final = None
        self.logprobs: list = []  # every chunk's TokenLogprob items so far (when the request asked for them)
        self.prompt_tokens = 0  # tokens of the prompt as submitted (after any truncation)

    async def chunks(self) -> AsyncIterator[Any]:
        """Engine chunks; the last one has ``done``. Raises the request's error."""
        try:
            async for c in self.req:
                if self.first_token_s is None and (c.text or c.done):
                    self.first_token_s = time.perf_counter() - self.t0
                if c.logprobs:
                    self.logprobs.extend(c.logprobs)
                if c.done:
                    self.finished = True
                    self.final = c
                yield c
        finally:
            self.close()

    def split(self, chunk) -> ReplyDelta:
        """A streamed chunk's text as (thinking, content, tool calls) decided so far; the last chunk also
        flushes what was held back."""
        delta = self.reply.feed(chunk.text) if chunk.text else ReplyDelta()
        return delta + self.reply.finish() if chunk.done else delta

    def split_text(self, text: str) -> ReplyDelta:
        """A whole answer (non-streaming) as (thinking, content, tool calls)."""
        return self.reply.parse(text)

    def metrics(self) -> dict:
        """Final metrics in Ollama's names; ``load_duration`` is the time spent loading for THIS request."""
        m = self.final.metrics.as_dict() if self.final is not None and self.final.metrics is not None else {}
        engine_load = int(m.get("load_duration") or 0)
        m["load_duration"] = self.load_ns
        m["total_duration"] = max(0, int(m.get("total_duration") or 0) - engine_load + self.load_ns)
        return m

    def close(self, status: str | None = None) -> None:
        """Idempotent: cancel an unfinished request (frees its slot within one step), release the model."""
        if self.closed:
            return
        self.closed = True
        if not self.finished:
            self.req.cancel()
        self.state.runtime.release_nowait(self.entry)
        mt = self.state.metrics
        if mt is not None:
            mt.requests.labels(self.route, status or ("ok" if self.finished else "cancelled")).inc()
            # a cancelled request counts what it did: its first token's time, its prompt and the tokens so far
            # (the engine's live figures; a runner child's reach the server only with the last chunk)
            mt.observe_done(self.model, self.metrics() if self.finished else self.partial_metrics(), self.first_token_s)

    def partial_metrics(self) -> dict:
        """An unfinished request's figures so far (Ollama's names), from the engine request's live metrics."""
        live = getattr(self.req, "metrics", None)
        try:
            return live.as_dict() if live is not None else {}
        except Exception:  # noqa: BLE001 - figures only
            return {}


MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


def logprobs_field(want: Any, top: Any) -> int:
    """Read ``logprobs`` (bool) and ``top_logprobs`` (int 0..20), as OpenAI's chat API and Ollama name them;
    returns -1 (none) or the number of alternatives per token. Raises OptionError on bad values."""
    if want in (None, False):
        if top not in (None, 0):
            raise OptionError("top_logprobs needs logprobs: true")
        return -1
    if want is not True:
        raise OptionError(f"logprobs must be true or false, got {want!r}")
    if top is None:
        return 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise OptionError(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
    return top


def logprob_entries(items) -> list[dict]:
    """Chunk logprobs in the shape both APIs use: ``{token, logprob, bytes, top_logprobs: [{token, logprob,
    bytes}]}`` (OpenAI's chat ``logprobs.content`` items; Ollama's ``logprobs`` items)."""
    return [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in e.top]} for e in items or ()]


def context_field(value: Any) -> list[int] | None:
    """``/api/generate``'s ``context`` (token ids an earlier call returned): None when absent or empty.

    Raises OptionError (400) when it is not a list of non-negative integers;
    :func:`with_context` checks the ids against the model's vocabulary.
    """
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise OptionError("context must be a list of token ids",
                          hint="send back the context an earlier /api/generate call returned")
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise OptionError(f"context holds {t!r}, not a token id (a non-negative integer)",
                              hint="send back the context an earlier /api/generate call returned")
    return value


def returned_context(tokens: list[int]) -> list[int]:
    """The ``context`` /api/generate returns for a prompt's and answer's ``tokens``: every token id, an image's
    placeholder ids (negative, :func:`ollapy.engine.media.placeholder_ids`) left out. Ollama's context is the
    tokenized prompt text and answer, in which an image is only its ``[img-N]`` tag: the picture itself is never
    in a context. So a returned context always passes :func:`context_field` when sent back (the earlier turn's
    text; send the image again to ask about it)."""
    return [t for t in tokens if t >= 0]


def with_context(prompt, context: list[int], n_vocab: int, bos: int | None):
    """``prompt`` (an engine Prompt) with the ``context`` tokens in front, as Ollama does: the earlier
    prompt and answer, then the new templated prompt. ``bos`` is the BOS id when the model adds one
    (else None): the new prompt's leading BOS is dropped, the context already starts the sequence.
    ``keep`` becomes the context's BOS; save points move with the tokens.

    Raises OptionError (400) for an id outside ``0 .. n_vocab - 1``.
    """
    bad = next((t for t in context if t >= n_vocab), None)
    if bad is not None:
        raise OptionError(f"context holds token id {bad}, but this model's vocabulary has {n_vocab} tokens",
                          hint="send back the context an earlier /api/generate call of this model returned")
    new = list(prompt.tokens)
    if bos is not None and new and new[0] == bos:
        new = new[1:]
    shift = len(context) - (len(prompt.tokens) - len(new))
    points = tuple(p + shift for p in prompt.save_points if 0 < p + shift < len(context) + len(new))
    keep = 1 if bos is not None and context[0] == bos else 0
    return dataclasses.replace(prompt, tokens=list(context) + new, keep=keep, save_points=points)


@dataclasses.dataclass
class ReplyPlan:
    """How one request uses tools and thinking: what the template gets, the grammar, and how to parse."""

    tools: list[dict] | None = None  # rendered into the prompt by the template
    think: bool | str | None = None  # the template's thinking switch (None: not set)
    fmt: Any = None  # the grammar's JSON schema, when the plan sets one (replaces the request's format)
    family: str | None = None  # tool-call format to parse (None: none)
    forced: bool = False
    names: list[str] | None = None
    generic: list[dict] | None = None  # tools described in the prompt in llama.cpp's generic format
    plain_history: bool = False  # the template has no tool support: tool calls and results are written as text


def reply_plan(model, name: str, opts, tools: list[dict] | None, choice: tuple[str, str | None],
               think: bool | str | None, *, parallel: bool = True, fmt: Any = None) -> ReplyPlan:
    """Check a request's tools and ``think`` against the model's template and plan the generation.

    ``think`` as Ollama: true (or a level) on a template without a reasoning section is a 400 ``"NAME" does
    not support thinking``; false there is ignored; unset on a thinking template means on. ``tools`` with
    ``tool_choice`` ``none`` render without tools and parse no calls. On a template that reads ``tools``,
    ``auto`` renders them and parses the template's own call format; ``required`` or a named function forces
    one call with a grammar. On a template without tool support (where Ollama answers 400 "does not support
    tools"), ollapy uses llama.cpp's generic format (:mod:`ollapy.chat.generic_tools`): the tools in the system
    prompt and a grammar for a call or a ``response`` (``fmt``, the request's format, constrains the response;
    ``parallel`` allows several calls); its history is written as text (:attr:`ReplyPlan.plain_history`).
    """
    mode, fname = choice
    plan = ReplyPlan(think=check_capabilities(name, can_think=model.supports_thinking, think=think),
                     plain_history=not model.supports_tools)
    if not tools or mode == "none":
        return plan
    plan.names = tool_names(tools)
    forced = mode == "required"
    if plan.think is not None and (forced or plan.plain_history):
        plan.think = False  # the grammar allows no reasoning before the answer
    if plan.plain_history:
        response = {"type": "object"} if fmt == "json" else fmt if isinstance(fmt, dict) else None
        plan.generic = tools
        plan.fmt = generic_tools.answer_schema(tools, forced=forced, name=fname, parallel=parallel, response=response)
        return plan
    plan.tools = tools
    if forced:
        plan.fmt, plan.forced = forced_call_schema(tools, fname), True
        return plan
    override = getattr(opts, "tool_parser", "auto")
    plan.family = detect_family(model.template.text, None if override == "auto" else override)
    return plan


def chat_messages(ref, messages: list[dict], plan: ReplyPlan, model: str = "") -> list[dict]:
    """The messages to render for a chat: the model's SYSTEM and MESSAGE lines applied (:func:`model_messages`),
    each assistant answer this process generated for ``model`` written as the model wrote it
    (:func:`ollapy.chat.answer_memory.written_history`), then, on a template without tool support, tool calls and
    results written as text and the tools described in llama.cpp's generic format
    (:func:`ollapy.chat.generic_tools.generic_messages`)."""
    msgs = model_messages(ref, messages)
    if plan.generic:
        return generic_tools.generic_messages(msgs, plan.generic, model)
    if plan.plain_history:
        return generic_tools.history_messages(msgs, model)
    return written_history(msgs, model)


async def start(state, name: str, *, route: str, messages: list[dict] | None = None, prompt: str | None = None,
                raw: bool = False, system: str | None = None, options: dict | None = None, fmt=None,
                keep_alive=None, cache: bool = True, context: list[int] | None = None,
                logprobs: int = -1, tools: list[dict] | None = None, tool_choice: tuple[str, str | None] = ("auto", None),
                think: bool | str | None = None, parallel_tool_calls: bool = True, overflow: str = "truncate",
                optional_think: bool = False, images: list | None = None) -> Generation:
    """Load ``name`` if needed and submit one generation; raises before anything is sent on errors.

    ``images``: Ollama's ``/api/generate`` base64 images, which go with the (templated) prompt.

    ``tools``/``tool_choice`` (mode, function name) and ``think`` are checked and planned by
    :func:`reply_plan`; the :class:`Generation`'s ``split`` gives the answer's thinking, content and calls.
    ``parallel_tool_calls`` false (OpenAI's): only the first call parsed is returned.

    ``options`` is the request's raw ``options`` object, read leniently by :func:`~ollapy.options.api_options`.
    ``context`` (generate only, not raw, as in Ollama) goes in front of the templated prompt
    (:func:`with_context`). ``logprobs`` >= 0: each chunk carries its tokens' log-probabilities and that many
    alternatives (:func:`logprobs_field` reads the request's fields).

    ``overflow``: what a prompt that does not fit ``num_ctx`` gets. ``"truncate"`` (Ollama's ``/api``): the
    request's ``truncate`` option decides (true, the default: cut it and log a warning; false: 400).
    ``"error"`` (``/v1``): :class:`~ollapy.errors.ContextOverflow` unless the request's ``options`` set
    ``truncate`` true (:func:`check_fits` says what fits). ``optional_think``: a ``think`` the model's template
    cannot honour is dropped instead of a 400 (Anthropic's ``thinking``, which agents send to any model).
    """
    t0 = time.perf_counter()
    rt = state.runtime
    if overflow == "error" and "truncate" not in (options or {}):
        options = {**(options or {}), "truncate": False}
    options = api_options(options)  # Ollama's leniency: unknown names and nulls skipped, wrong types refused
    ref = await rt.resolve(name)
    entry, opts, load_ns = await rt.acquire(name, options, keep_alive, ref=ref)
    try:
        model = entry.model
        if optional_think and not model.supports_thinking:
            think = None
        plan = reply_plan(model, name, opts, tools, tool_choice, think, parallel=parallel_tool_calls, fmt=fmt)
        p = await build_prompt(rt, entry, ref, opts, plan, messages=messages, prompt=prompt, raw=raw, system=system,
                               context=context, images=images)
        if not opts.truncate:
            check_fits(len(p.tokens), opts)
        elif p.truncated:
            log.warning("%s: prompt did not fit num_ctx %d; truncated to %d tokens (send truncate: false for an "
                        "error instead)", route, opts.num_ctx, len(p.tokens))
        # a raw prompt is split only when thinking was asked for (its text is the caller's, not a template's)
        constrained = plan.forced or plan.generic is not None
        opened = not constrained and (not raw or think_enabled(plan.think)) and prompt_opens_thinking(p.text)
        seed = opts.seed if opts.seed >= 0 else None
        calls = generic_tools.GenericCallParser(ids=True, seed=seed, tool_names=plan.names) if plan.generic else None
        reply = ReplyParser(think=think_enabled(plan.think), opened=opened,
                            family=plan.family, forced=plan.forced, tool_names=plan.names, ids=True,
                            seed=seed, max_calls=None if parallel_tool_calls else 1, calls=calls,
                            model=entry.key if messages is not None else None)
        # off the loop: a JSON-schema grammar compiles here, a runner child answers here
        req = await rt.call(entry, model.submit, p, opts, fmt=plan.fmt if constrained else fmt, cache=cache,
                            loop=asyncio.get_running_loop(), logprobs=logprobs,
                            late=lambda r: r.cancel())
    except BaseException:
        rt.release_nowait(entry)
        raise
    if req.metrics.truncated and not p.truncated:
        log.warning("%s: prompt of %d tokens did not fit num_ctx %d; truncated (send truncate: false for an "
                    "error instead)", route, len(p.tokens), opts.num_ctx)
    gen = Generation(state, entry, req, load_ns, t0, route, reply)
    gen.prompt_tokens = len(p.tokens)
    return gen


def check_fits(n_tokens: int, opts) -> None:
    """Raise :class:`~ollapy.errors.ContextOverflow` (400) when a prompt of ``n_tokens`` leaves no room for the
    answer in ``opts.num_ctx``.

    Room for the answer is ``num_predict`` tokens when set, at most an eighth of the context (a context shift
    makes room for longer answers), else one token: a prompt may take ``num_ctx - room`` tokens.
    """
    n_ctx = opts.num_ctx
    room = min(opts.num_predict, n_ctx // 8) if opts.num_predict > 0 else 1
    limit = max(1, n_ctx - max(1, room))
    if n_tokens > limit:
        raise ContextOverflow(n_tokens, limit, n_ctx)


async def build_prompt(rt, entry, ref, opts, plan: ReplyPlan, *, messages: list[dict] | None = None,
                       prompt: str | None = None, raw: bool = False, system: str | None = None,
                       context: list[int] | None = None, images: list | None = None):
    """The engine Prompt of a request (see :func:`start`), rendered and tokenized off the event loop
    (``rt.call``): ``messages`` (a chat, the model's SYSTEM and MESSAGE applied, tools as ``plan`` says), else
    ``prompt`` (raw, or templated with ``system`` and ``context`` in front). ``opts.truncate`` true cuts a chat
    that does not fit."""
    model = entry.model
    extra = {"tools": plan.tools, "think": plan.think}
    if messages is not None:
        msgs = chat_messages(ref, messages, plan, entry.key)
        return await rt.call(entry, model.chat_prompt, msgs, opts, **extra)
    if raw and images:
        raise ImageError("images with raw: true are not supported", hint="send the prompt without raw")
    if raw:
        return await rt.call(entry, model.raw_prompt, prompt or "")
    msgs = []
    sys_text = system if system is not None else getattr(ref, "system", None)
    if sys_text:
        msgs.append({"role": "system", "content": sys_text})
    msgs.append(_clean_message({"role": "user", "content": prompt or "", "images": images or None}))
    msgs = model_messages(_NoSystem(ref), msgs)
    p = await rt.call(entry, model.chat_prompt, msgs, opts, **extra)
    if context:
        f = model.facts
        p = with_context(p, context, f.n_vocab, f.bos if f.add_bos else None)
    return p


async def count_tokens(state, name: str, *, messages: list[dict], tools: list[dict] | None = None,
                       tool_choice: tuple[str, str | None] = ("auto", None), think: bool | str | None = None,
                       optional_think: bool = False) -> int:
    """The number of prompt tokens ``messages`` (with ``tools`` and ``think``, as :func:`start` renders them)
    make for model ``name``, untruncated; loads the model as a generation would. Raises as :func:`start`."""
    p = await chat_prompt_of(state, name, messages=messages, tools=tools, tool_choice=tool_choice, think=think,
                             optional_think=optional_think)
    return len(p.tokens)


async def chat_prompt_of(state, name: str, *, messages: list[dict], tools: list[dict] | None = None,
                         tool_choice: tuple[str, str | None] = ("auto", None), think: bool | str | None = None,
                         optional_think: bool = False):
    """The engine Prompt (``text`` and ``tokens``) a chat of ``messages`` evaluates on model ``name``, exactly as
    :func:`start` builds it, untruncated; loads the model as a generation would. Raises as :func:`start`."""
    rt = state.runtime
    ref = await rt.resolve(name)
    entry, opts, _ = await rt.acquire(name, api_options({"truncate": False}), None, ref=ref)
    try:
        model = entry.model
        if optional_think and not model.supports_thinking:
            think = None
        plan = reply_plan(model, name, opts, tools, tool_choice, think)
        p = await build_prompt(rt, entry, ref, opts, plan, messages=messages)
    finally:
        rt.release_nowait(entry)
    return p


class _NoSystem:
    """A ref whose system prompt was already applied (generate's ``system`` field or the model's)."""

    def __init__(self, ref) -> None:
        self.system = None
        self.messages = getattr(ref, "messages", None)
