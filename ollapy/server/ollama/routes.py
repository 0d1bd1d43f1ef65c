"""Ollama's generation HTTP API with its field names and semantics.

``/``, ``/api/version``, ``/api/generate``, ``/api/chat`` (NDJSON streaming by
default, ``stream: false`` for one object; durations in ns; ``done_reason``),
``/api/ps``. The model-management routes (``/api/pull``, ``/api/tags``,
``/api/show``, ``/api/delete``, ``/api/copy``, ``/api/create``,
``/api/blobs/:digest``) live in :mod:`ollapy.server.ollama.models`; request
bodies in :mod:`ollapy.server.ollama.bodies`; the shared HTTP helpers in
:mod:`ollapy.server.http`. Final chunks also carry ollapy's extras
``truncated``, ``prompt_cache_tokens`` and, when tokens were reused,
``prompt_cache_source`` (``slot``, ``copy``, ``cache ram``, ``cache disk``). An error after a stream started is
its last line, ``{"error": "..."}``. ``/api/generate`` with ``suffix`` is a code completion
(:mod:`ollapy.server.fim`).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ollapy import __version__
from ollapy.chat.fim import FimRequest
from ollapy.chat.reply import ReplyDelta
from ollapy.options import api_options
from ollapy.server import fim, generation
from ollapy.server.errors import redact_paths
from ollapy.server.http import chunk_objects, collected, err, ndjson_response, read_body, state_of
from ollapy.server.ollama.bodies import ChatBody, GenerateBody, OllamaGenBody
from ollapy.server.ollama.details import gguf_info, iso_time, manifest_ids, model_details

router = APIRouter()


# ---- simple routes --------------------------------------------------------------------------------
@router.get("/")
async def root(request: Request):
    from ollapy.server import webui

    if webui.wants_page(request):  # a browser: the chat page (serve --no-webui turns it off)
        return webui.page_response()
    return PlainTextResponse("Ollama is running (ollapy)")


@router.head("/")
async def root_head():
    return Response(status_code=200, media_type="text/plain")


OLLAMA_API_VERSION = "0.16.0"
"""The Ollama release whose API ollapy's server speaks, reported by ``/api/version`` as Ollama reports its own:
Ollama clients gate features on it (Codex's ``--oss`` needs 0.13.4 or newer for ``/v1/responses``; Ollama
0.14.0 added ``/v1/messages``; 0.16.0 is the release with ``ollama launch``). ``ollapy --version`` and
``ollapy info`` report ollapy's own version, which the response carries as ``ollapy_version``."""


@router.get("/api/version")
@router.head("/api/version")
async def version():
    return {"version": OLLAMA_API_VERSION, "ollapy_version": __version__}


# ---- generate / chat ------------------------------------------------------------------------------
@router.post("/api/generate")
async def api_generate(request: Request):
    st = state_of(request)
    try:
        body = GenerateBody.from_dict(await read_body(request))
        if not body.prompt:  # as Ollama: an empty prompt only loads (or unloads) the model, suffix or not
            return await _load_or_unload(st, body, {"response": ""})
        if body.suffix:  # fill-in-the-middle (ollapy.server.fim): system and images unused, as in Ollama
            gen = await fim.start_fim(st, body.model, FimRequest(prefix=body.prompt, suffix=body.suffix),
                                      route="generate", options=body.run_options(), keep_alive=body.keep_alive,
                                      cache=body.cache, context=body.context, fmt=body.format,
                                      raw_prompt=body.prompt if body.raw else None, logprobs=body.logprob_count)
        else:
            gen = await generation.start(st, body.model, route="generate", prompt=body.prompt, raw=body.raw,
                                         images=body.images,
                                         system=body.system, options=body.run_options(), fmt=body.format,
                                         keep_alive=body.keep_alive, cache=body.cache, context=body.context,
                                         logprobs=body.logprob_count, think=body.think)
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)

    def with_context(final) -> dict:
        return {"context": final.tokens} if not body.raw and final.tokens is not None else {}

    def response(d: ReplyDelta) -> dict:
        return {"response": d.content, **({"thinking": d.thinking} if d.thinking else {})}

    return await _answer(request, gen, body, response, with_context)


@router.post("/api/chat")
async def api_chat(request: Request):
    st = state_of(request)
    try:
        body = ChatBody.from_dict(await read_body(request))
        if not body.messages:
            return await _load_or_unload(st, body, _message(""))
        gen = await generation.start(st, body.model, route="chat", messages=body.messages, options=body.run_options(),
                                     fmt=body.format, keep_alive=body.keep_alive, cache=body.cache,
                                     logprobs=body.logprob_count, tools=body.tools,
                                     tool_choice=body.choice, think=body.think)
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    index = 0

    def message(d: ReplyDelta) -> dict:
        nonlocal index
        msg = _message(d.content)
        if d.thinking:
            msg["message"]["thinking"] = d.thinking
        if d.calls:
            msg["message"]["tool_calls"] = tool_calls(d.calls, index)
            index += len(d.calls)
        return msg

    return await _answer(request, gen, body, message)


def _message(text: str) -> dict:
    """Chat's answer field: ``{"message": {"role": "assistant", "content": text}}``."""
    return {"message": {"role": "assistant", "content": text}}


def tool_calls(calls, start: int = 0) -> list[dict]:
    """Ollama's ``message.tool_calls``: ``[{"id", "function": {"index", "name", "arguments": {...}}}]``;
    ``start`` is the index of the first (calls streamed in several chunks keep counting)."""
    return [{"id": c.id, "function": {"index": start + i, "name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]


async def _answer(request: Request, gen: generation.Generation, body: OllamaGenBody,
                  answer: Callable[[ReplyDelta], dict], extra: Callable[[Any], dict] = lambda final: {}):
    """The response to a started generation, whole (``stream: false``) or as NDJSON chunks.

    ``answer(delta)`` is the route's answer fields for a piece of the reply (generate's ``response`` and
    ``thinking``, chat's ``message`` with ``thinking`` and ``tool_calls``); ``extra(final)`` adds fields to the
    last object (generate's ``context``). Each object carries ``logprobs`` when asked."""

    def last(final, d: ReplyDelta) -> dict:
        obj = {"model": body.model, "created_at": generation.now_iso(), **answer(d), "done": True}
        obj.update(_final_fields(gen, final))
        obj.update(extra(final))
        return obj

    if not body.stream:
        return await collected(request, gen, lambda text, final: _with_logprobs(last(final, gen.split_text(text)),
                                                                                gen.req, gen.logprobs))

    def objects(c) -> Iterator[dict]:
        d = gen.split(c)
        sent = bool(d) or (gen.req.logprobs >= 0 and bool(c.logprobs))
        if sent:
            yield _with_logprobs({"model": body.model, "created_at": generation.now_iso(), **answer(d),
                                  "done": False}, gen.req, c.logprobs)
        if c.done:
            yield _with_logprobs(last(c, ReplyDelta()), gen.req, None if sent else c.logprobs)

    return ndjson_response(chunk_objects(gen, objects), gen.close)


def _final_fields(gen: generation.Generation, final) -> dict:
    m = gen.metrics()
    out = {"done_reason": final.done_reason or "stop"}
    for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
              "eval_duration", "prompt_cache_tokens", "truncated"):
        out[k] = m.get(k, 0)
    if m.get("prefix_source") not in (None, "", "none"):  # where the reused tokens came from: slot, cache disk...
        out["prompt_cache_source"] = m["prefix_source"]
    if m.get("draft"):  # speculative decoding (ollapy's extras): how it drafted, tokens verified and accepted
        out.update(draft=m["draft"], draft_tokens=m.get("draft_tokens", 0), draft_accepted=m.get("draft_accepted", 0))
    if m.get("image_encode_duration"):  # ns the projector took for this request's images (ollapy's extra)
        out["image_encode_duration"] = m["image_encode_duration"]
    return out


def _with_logprobs(obj: dict, req, items) -> dict:
    """Add Ollama's ``logprobs`` list to a response object when the request asked for them."""
    if req.logprobs >= 0 and items is not None:
        obj["logprobs"] = generation.logprob_entries(items)
    return obj


def _keep_alive_zero(v: Any) -> bool:
    from ollapy.server.scheduler import parse_keep_alive

    return v is not None and parse_keep_alive(v) == 0


async def _load_or_unload(st, body: OllamaGenBody, answer: dict):
    """Ollama's empty prompt / empty messages: load the model (or unload it with keep_alive 0)."""
    base = {"model": body.model, "created_at": generation.now_iso(), **answer}
    if _keep_alive_zero(body.keep_alive):
        await st.runtime.unload(body.model)
        return JSONResponse({**base, "done": True, "done_reason": "unload"})
    entry, load_ns = await st.runtime.load_only(body.model, api_options(body.options), body.keep_alive)
    return JSONResponse({**base, "done": True, "done_reason": "load", "load_duration": load_ns,
                         "total_duration": load_ns})


# ---- ps -------------------------------------------------------------------------------------------
@router.get("/api/ps")
async def api_ps(request: Request):
    st = state_of(request)
    out = []
    rows = st.runtime.ps()  # from each runner's snapshot: never waits on a runner
    ids = await asyncio.to_thread(manifest_ids) if rows else {}
    for s in rows:
        e = st.runtime.models.get(s["key"])
        ref = e.ref if e is not None else None
        gguf = await asyncio.to_thread(gguf_info, getattr(ref, "path", None))
        stats = s["stats"] or {}
        out.append({
            "name": s["key"], "model": s["key"], "size": s["size"],
            "digest": ids.get(s["key"]) or getattr(ref, "digest", None) or "",
            "details": model_details(gguf),
            "expires_at": iso_time(s["expires_at"]) if s["expires_at"] is not None else "2318-01-01T00:00:00Z",
            "size_vram": s["size_vram"], "context_length": s["num_ctx"],
            # ollapy extras
            "num_parallel": s["num_parallel"], "slots_busy": stats.get("slots_busy", 0),
            "queue_depth": stats.get("queue_depth", 0), "active_requests": s["active"],
            # the runner did not refresh its figures lately (stopped or hung): they are its last ones, this old
            "stale": s["stale"], "stats_age_s": s["age_s"],
            "prompt_cache": s["cache"],
            "kv_bytes_per_token": (s["info"] or {}).get("kv_bytes_per_token", 0),
            "kv_bytes_per_slot": (s["info"] or {}).get("kv_bytes_per_slot", 0),
            "kv_cache_type": e.options.kv_cache_type if e is not None else None,
            "rpc": (e.options.rpc or None) if e is not None else None,  # "host:port,…" whose devices hold layers
            "runner_pid": (s["info"] or {}).get("runner_pid"),  # a model in a child runner process
            # speculative decoding: the draft model's name or "ngram" (its default), and the tokens drafted and
            # accepted since it loaded (requests may also draft with their own options.draft)
            "row_invariant": (s["info"] or {}).get("row_invariant"),  # rows computed alike in any batch
            "draft": redact_paths(stats.get("draft") or "") or None, "draft_tokens": stats.get("draft_tokens", 0),
            "draft_accepted": stats.get("draft_accepted", 0),
        })
    return {"models": out}
