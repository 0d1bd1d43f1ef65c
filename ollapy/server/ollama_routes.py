"""Ollama's HTTP API with its field names and semantics: generation and the helpers all routes share.

``/``, ``/api/version``, ``/api/generate``, ``/api/chat`` (NDJSON streaming by
default, ``stream: false`` for one object; durations in ns; ``done_reason``),
``/api/ps``. The model-management routes (``/api/pull``, ``/api/tags``,
``/api/show``, ``/api/delete``, ``/api/copy``, ``/api/create``,
``/api/blobs/:digest``) live in :mod:`ollapy.server.model_routes`.
Final chunks also carry ollapy's extras ``truncated`` and
``prompt_cache_tokens``. An error after a stream started is its last line,
``{"error": "..."}``.
"""
from __future__ import annotations

import asyncio
import datetime
import functools
import json
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.responses import StreamingResponse

from .. import __version__
from ..errors import OptionError, UsageError
from ..options import api_options
from . import generation
from .errors import ollama_error, stream_error_line

router = APIRouter()
NDJSON = "application/x-ndjson"


# ---- helpers --------------------------------------------------------------------------------------
def state_of(request: Request):
    """The app's shared State (runtime, metrics)."""
    return request.app.state.ollapy


async def read_body(request: Request) -> dict:
    """The JSON object body (``{}`` when empty); ValueError (400) when it is not a JSON object."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise UsageError("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise UsageError("request body must be a JSON object")
    return data


def model_field(data: dict, required: bool = True) -> str:
    """``model`` (or the older ``name``) from a body, validated by the store's name rules (or a .gguf path)."""
    name = data.get("model") or data.get("name") or ""
    if not isinstance(name, str) or (required and not name.strip()):
        raise UsageError("model is required", hint='send {"model": "NAME", ...}')
    return name.strip()


def check_name(name: str) -> None:
    """Validate a model name (no path traversal; InvalidModelName → 400); ``*.gguf`` paths without ``..`` are allowed."""
    from ..store import parse_name
    from ..store.names import looks_like_path

    if looks_like_path(name) and name.lower().endswith(".gguf") and ".." not in Path(name).parts:
        return  # a GGUF file given by path (the CLI's `run ./model.gguf` through a server)
    parse_name(name)


def err(exc: BaseException) -> JSONResponse:
    """Ollama-style JSON error response."""
    status, body = ollama_error(exc)
    return JSONResponse(body, status_code=status)


def errors_as_json(route: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Decorate a route whose every exception becomes :func:`err`'s JSON error (FastAPI still sees the
    route's own signature through ``functools.wraps``)."""

    @functools.wraps(route)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await route(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            return err(exc)

    return wrapper


class GenStream(StreamingResponse):
    """A streaming response that watches for the client going away and always closes its generation."""

    def __init__(self, content, on_close: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def run() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        break
                tg.cancel_scope.cancel()
        finally:
            self.on_close()


async def watch_disconnect(request: Request, gen: generation.Generation) -> None:
    """For non-streaming answers: cancel the generation when the client goes away."""
    try:
        while not gen.finished and not gen.closed:
            if await request.is_disconnected():
                gen.close("client gone")
                return
            await asyncio.sleep(0.25)
    except asyncio.CancelledError:
        pass


async def collect(request: Request, gen: generation.Generation) -> tuple[str, Any]:
    """Read a generation to the end (non-streaming): ``(text, final chunk)``."""
    watcher = asyncio.get_running_loop().create_task(watch_disconnect(request, gen))
    parts = []
    try:
        async for c in gen.chunks():
            parts.append(c.text)
    finally:
        watcher.cancel()
        gen.close()
    return "".join(parts), gen.final


def _final_fields(gen: generation.Generation, final) -> dict:
    m = gen.metrics()
    out = {"done_reason": final.done_reason or "stop"}
    for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
              "eval_duration", "prompt_cache_tokens", "truncated"):
        out[k] = m.get(k, 0)
    return out


def _keep_alive_zero(v: Any) -> bool:
    from ..runtime import parse_keep_alive

    return v is not None and parse_keep_alive(v) == 0


def _fmt(value: Any):
    if value in (None, ""):
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise OptionError(f"format must be 'json' or a JSON schema object, got {value!r}")


# ---- simple routes --------------------------------------------------------------------------------
@router.get("/")
async def root():
    return PlainTextResponse("Ollama is running (ollapy)")


@router.head("/")
async def root_head():
    return Response(status_code=200, media_type="text/plain")


@router.get("/api/version")
@router.head("/api/version")
async def version():
    return {"version": __version__}


# ---- generate / chat ------------------------------------------------------------------------------
@router.post("/api/generate")
async def api_generate(request: Request):
    st = state_of(request)
    try:
        data = await read_body(request)
        name = model_field(data)
        check_name(name)
        if data.get("images"):
            raise OptionError("images are not supported by ollapy models")
        prompt = data.get("prompt") or ""
        if not isinstance(prompt, str):
            raise OptionError("prompt must be a string")
        ka = data.get("keep_alive")
        context = generation.context_field(data.get("context"))
        if not prompt and not data.get("suffix"):
            return await _load_or_unload(st, name, data, ka, chat=False)
        gen = await generation.start(st, name, route="generate", prompt=prompt, raw=bool(data.get("raw")),
                                     system=data.get("system"), options=data.get("options"), fmt=_fmt(data.get("format")),
                                     keep_alive=ka, cache=data.get("cache", True) is not False, context=context,
                                     logprobs=generation.logprobs_field(data.get("logprobs"), data.get("top_logprobs")))
    except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
        return err(exc)
    model = data.get("model") or name
    raw = bool(data.get("raw"))

    def final_obj(final) -> dict:
        obj = {"model": model, "created_at": generation.now_iso(), "response": "", "done": True}
        obj.update(_final_fields(gen, final))
        if not raw and final.tokens is not None:
            obj["context"] = final.tokens
        return obj

    if data.get("stream", True) is False:
        try:
            text, final = await collect(request, gen)
        except Exception as exc:  # noqa: BLE001
            return err(exc)
        obj = final_obj(final)
        obj["response"] = text
        return JSONResponse(_with_logprobs(obj, gen.req, gen.logprobs))

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for c in gen.chunks():
                if c.text:
                    yield ndjson_line(_with_logprobs({"model": model, "created_at": generation.now_iso(),
                                                      "response": c.text, "done": False}, gen.req, c.logprobs))
                if c.done:
                    yield ndjson_line(_with_logprobs(final_obj(c), gen.req, None if c.text else c.logprobs))
        except Exception as exc:  # noqa: BLE001
            yield stream_error_line(exc)

    return GenStream(lines(), gen.close, NDJSON)


@router.post("/api/chat")
async def api_chat(request: Request):
    st = state_of(request)
    try:
        data = await read_body(request)
        name = model_field(data)
        check_name(name)
        messages = data.get("messages") or []
        if not isinstance(messages, list):
            raise OptionError("messages must be a list")
        if data.get("tools"):
            raise OptionError(f"{name} does not support tools in ollapy")
        ka = data.get("keep_alive")
        if not messages:
            return await _load_or_unload(st, name, data, ka, chat=True)
        gen = await generation.start(st, name, route="chat", messages=messages, options=data.get("options"),
                                     fmt=_fmt(data.get("format")), keep_alive=ka,
                                     cache=data.get("cache", True) is not False,
                                     logprobs=generation.logprobs_field(data.get("logprobs"), data.get("top_logprobs")))
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    model = data.get("model") or name

    def final_obj(final) -> dict:
        obj = {"model": model, "created_at": generation.now_iso(), "message": {"role": "assistant", "content": ""},
               "done": True}
        obj.update(_final_fields(gen, final))
        return obj

    if data.get("stream", True) is False:
        try:
            text, final = await collect(request, gen)
        except Exception as exc:  # noqa: BLE001
            return err(exc)
        obj = final_obj(final)
        obj["message"]["content"] = text
        return JSONResponse(_with_logprobs(obj, gen.req, gen.logprobs))

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for c in gen.chunks():
                if c.text:
                    yield ndjson_line(_with_logprobs({"model": model, "created_at": generation.now_iso(),
                                                      "message": {"role": "assistant", "content": c.text},
                                                      "done": False}, gen.req, c.logprobs))
                if c.done:
                    yield ndjson_line(_with_logprobs(final_obj(c), gen.req, None if c.text else c.logprobs))
        except Exception as exc:  # noqa: BLE001
            yield stream_error_line(exc)

    return GenStream(lines(), gen.close, NDJSON)


def _with_logprobs(obj: dict, req, items) -> dict:
    """Add Ollama's ``logprobs`` list to a response object when the request asked for them."""
    if req.logprobs >= 0 and items is not None:
        obj["logprobs"] = generation.logprob_entries(items)
    return obj


def ndjson_line(obj: dict) -> bytes:
    """One NDJSON line (UTF-8, non-ASCII kept)."""
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


async def _load_or_unload(st, name: str, data: dict, ka: Any, chat: bool):
    """Ollama's empty prompt / empty messages: load the model (or unload it with keep_alive 0)."""
    model = data.get("model") or name
    base = {"model": model, "created_at": generation.now_iso()}
    if chat:
        base["message"] = {"role": "assistant", "content": ""}
    else:
        base["response"] = ""
    if _keep_alive_zero(ka):
        await st.runtime.unload(name)
        return JSONResponse({**base, "done": True, "done_reason": "unload"})
    entry, load_ns = await st.runtime.load_only(name, api_options(data.get("options")), ka)
    return JSONResponse({**base, "done": True, "done_reason": "load", "load_duration": load_ns,
                         "total_duration": load_ns})

# ---- ps (and model details shared with model_routes) ------------------------------------------
def iso_time(ts: float | None) -> str:
    """A UTC timestamp as Ollama writes it (``Z`` suffix; Go's zero time for None)."""
    if ts is None:
        return "0001-01-01T00:00:00Z"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def model_details(info: dict | None) -> dict:
    """Ollama's ``details`` object from GGUF info."""
    info = info or {}
    arch = info.get("architecture") or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": str(info.get("parameters") or ""), "quantization_level": str(info.get("quantization") or "")}

def _manifest_ids() -> dict[str, str]:
    """name -> the model's ID (manifest digest, :func:`ollapy.store.resolve.manifest_digest`): the same ID
    `ollapy list`, `ollapy ps` and /api/tags show."""
    from ..store import list_models

    return {m.name: m.digest for m in list_models() if m.digest}


@router.get("/api/ps")
async def api_ps(request: Request):
    st = state_of(request)
    out = []
    ids = await asyncio.to_thread(_manifest_ids) if st.runtime.ps() else {}
    for s in st.runtime.ps():
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
            "prompt_cache": s["cache"],
            "kv_bytes_per_token": (s["info"] or {}).get("kv_bytes_per_token", 0),
            "kv_bytes_per_slot": (s["info"] or {}).get("kv_bytes_per_slot", 0),
            "kv_cache_type": e.options.kv_cache_type if e is not None else None,
        })
    return {"models": out}

_GGUF_CACHE: dict[str, dict] = {}


def gguf_info(path) -> dict:
    """GGUF metadata of ``path``, cached per path (``{}`` for None or an unreadable file)."""
    if path is None:
        return {}
    key = str(path)
    if key not in _GGUF_CACHE:
        try:
            from ..store.info import read_gguf_info

            _GGUF_CACHE[key] = read_gguf_info(Path(path))
        except Exception:  # noqa: BLE001
            _GGUF_CACHE[key] = {}
    return _GGUF_CACHE[key]
