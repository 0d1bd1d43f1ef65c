"""Ollama's HTTP API with its field names and semantics.

``/``, ``/api/version``, ``/api/generate``, ``/api/chat`` (NDJSON streaming by
default, ``stream: false`` for one object; durations in ns; ``done_reason``),
``/api/pull`` (streamed statuses), ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/delete``, ``/api/copy``, ``/api/create``, ``/api/blobs/:digest``.
Final chunks also carry ollapy's extras ``truncated`` and
``prompt_cache_tokens``. An error after a stream started is its last line,
``{"error": "..."}``.
"""
from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.responses import StreamingResponse

from .. import __version__
from ..errors import OptionError, UsageError
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
        if not prompt and not data.get("suffix"):
            return await _load_or_unload(st, name, data, ka, chat=False)
        gen = await generation.start(st, name, route="generate", prompt=prompt, raw=bool(data.get("raw")),
                                     system=data.get("system"), options=data.get("options"), fmt=_fmt(data.get("format")),
                                     keep_alive=ka, cache=data.get("cache", True) is not False)
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
        return JSONResponse(obj)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for c in gen.chunks():
                if c.text:
                    yield _line({"model": model, "created_at": generation.now_iso(), "response": c.text, "done": False})
                if c.done:
                    yield _line(final_obj(c))
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
                                     cache=data.get("cache", True) is not False)
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
        return JSONResponse(obj)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for c in gen.chunks():
                if c.text:
                    yield _line({"model": model, "created_at": generation.now_iso(),
                                 "message": {"role": "assistant", "content": c.text}, "done": False})
                if c.done:
                    yield _line(final_obj(c))
        except Exception as exc:  # noqa: BLE001
            yield stream_error_line(exc)

    return GenStream(lines(), gen.close, NDJSON)


def _line(obj: dict) -> bytes:
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
    entry, load_ns = await st.runtime.load_only(name, data.get("options"), ka)
    return JSONResponse({**base, "done": True, "done_reason": "load", "load_duration": load_ns,
                         "total_duration": load_ns})


# ---- ps / tags / show -----------------------------------------------------------------------------
def _iso(ts: float | None) -> str:
    if ts is None:
        return "0001-01-01T00:00:00Z"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _details(info: dict | None) -> dict:
    info = info or {}
    arch = info.get("architecture") or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": str(info.get("parameters") or ""), "quantization_level": str(info.get("quantization") or "")}


@router.get("/api/ps")
async def api_ps(request: Request):
    st = state_of(request)
    out = []
    for s in st.runtime.ps():
        e = st.runtime.models.get(s["key"])
        ref = e.ref if e is not None else None
        gguf = await asyncio.to_thread(_gguf_info, getattr(ref, "path", None))
        stats = s["stats"] or {}
        out.append({
            "name": s["key"], "model": s["key"], "size": s["size"],
            "digest": getattr(ref, "digest", None) or "",
            "details": _details(gguf),
            "expires_at": _iso(s["expires_at"]) if s["expires_at"] is not None else "2318-01-01T00:00:00Z",
            "size_vram": s["size_vram"], "context_length": s["num_ctx"],
            # ollapy extras
            "num_parallel": s["num_parallel"], "slots_busy": stats.get("slots_busy", 0),
            "queue_depth": stats.get("queue_depth", 0), "active_requests": s["active"],
            "prompt_cache": s["cache"],
        })
    return {"models": out}


_GGUF_CACHE: dict[str, dict] = {}


def _gguf_info(path) -> dict:
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


@router.get("/api/tags")
async def api_tags(request: Request):
    try:
        from ..store import list_models

        models = await asyncio.to_thread(list_models)
        out = []
        for m in models:
            if m.broken:
                continue
            path = None
            try:
                layers = m.entry.model_layers()
                if layers:
                    from ..store.pull import local_store

                    path = local_store().layer_file(layers[0]) if m.store == "ollapy" else None
            except Exception:  # noqa: BLE001
                path = None
            info = await asyncio.to_thread(_gguf_info, path)
            digest = hashlib.sha256(m.entry.path.read_bytes()).hexdigest() if m.entry.path.is_file() else m.id
            out.append({"name": m.name, "model": m.name, "modified_at": _iso(m.modified), "size": m.size,
                        "digest": digest, "details": _details(info)})
        return {"models": out}
    except Exception as exc:  # noqa: BLE001
        return err(exc)


@router.post("/api/show")
async def api_show(request: Request):
    try:
        data = await read_body(request)
        name = model_field(data)
        check_name(name)
        ref = await state_of(request).runtime.resolve(name)
        info = await asyncio.to_thread(_gguf_info, ref.path)
        from ..store.modelfile import format_modelfile

        params = dict(ref.parameters or {})
        param_text = "\n".join(f"{k:<30} {json.dumps(x) if isinstance(x, str) else x}"
                               for k, v in params.items() for x in (v if isinstance(v, (list, tuple)) else [v]))
        template = ref.template or info.get("chat_template") or ""
        arch = info.get("architecture") or ""
        model_info = {"general.architecture": arch, "general.parameter_count": info.get("parameter_count"),
                      f"{arch}.context_length": info.get("context_length"),
                      f"{arch}.embedding_length": info.get("embedding_length")}
        return {
            "modelfile": format_modelfile(str(ref.path), params, ref.system, ref.template, ref.license,
                                          list(ref.messages or [])),
            "parameters": param_text,
            "template": template,
            "system": ref.system or "",
            "license": ref.license or "",
            "details": _details(info),
            "model_info": {k: v for k, v in model_info.items() if v is not None},
            "messages": list(ref.messages or []),
            "capabilities": ["completion"],
            "modified_at": _iso(Path(ref.path).stat().st_mtime if Path(ref.path).exists() else None),
        }
    except Exception as exc:  # noqa: BLE001
        return err(exc)


# ---- delete / copy ------------------------------------------------------------------------------
@router.delete("/api/delete")
async def api_delete(request: Request):
    try:
        data = await read_body(request)
        name = model_field(data)
        from ..store import parse_name, remove_model

        parse_name(name)
        await state_of(request).runtime.unload(name)
        await asyncio.to_thread(remove_model, name)
        return Response(status_code=200)
    except Exception as exc:  # noqa: BLE001
        return err(exc)


@router.post("/api/copy")
async def api_copy(request: Request):
    try:
        data = await read_body(request)
        src, dst = data.get("source"), data.get("destination")
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            raise UsageError("source and destination are required")
        from ..store import copy_model, parse_name

        parse_name(src)
        parse_name(dst)
        await asyncio.to_thread(copy_model, src, dst)
        return Response(status_code=200)
    except Exception as exc:  # noqa: BLE001
        return err(exc)


# ---- pull / create / blobs (long-running: progress streamed from a worker thread) -----------------
class _ThreadProgress:
    """The store's progress interface (stage/start/advance/finish) turned into Ollama pull statuses."""

    def __init__(self, emit: Callable[[dict], None]) -> None:
        self.emit = emit
        self._tasks: dict[int, list] = {}
        self._last = 0.0

    def stage(self, text: str) -> None:
        self.emit({"status": text})

    def start(self, label: str, total: int | None, done: int = 0) -> Any:
        key = len(self._tasks)
        self._tasks[key] = [label, total or 0, done]
        self.emit(self._status(key))
        return key

    def advance(self, task: Any, nbytes: int) -> None:
        t = self._tasks.get(task)
        if t is None:
            return
        t[2] += nbytes
        now = time.monotonic()
        if now - self._last >= 0.1:
            self._last = now
            self.emit(self._status(task))

    def finish(self, task: Any) -> None:
        t = self._tasks.get(task)
        if t is None:
            return
        if t[1]:
            t[2] = t[1]
        self.emit(self._status(task))

    def close(self) -> None:
        pass

    def _status(self, key: int) -> dict:
        label, total, done = self._tasks[key]
        digest = label if str(label).startswith("sha256") else ""
        return {"status": f"pulling {str(label).removeprefix('sha256:')[:12]}", "digest": digest,
                "total": total, "completed": done}


async def _threaded_progress(request: Request, work: Callable[[Callable[[dict], None]], None], stream: bool):
    """Run ``work(emit)`` in a thread; stream what it emits as NDJSON (or answer the last status)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def emit(obj: dict) -> None:
        loop.call_soon_threadsafe(q.put_nowait, obj)

    def run() -> None:
        try:
            work(emit)
            emit({"status": "success"})
        except BaseException as exc:  # noqa: BLE001
            loop.call_soon_threadsafe(q.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(q.put_nowait, None)

    threading.Thread(target=run, name="ollapy-store-op", daemon=True).start()
    if not stream:
        last: Any = None
        while True:
            item = await q.get()
            if item is None:
                break
            if isinstance(item, BaseException):
                return err(item)
            last = item
        return JSONResponse(last or {"status": "success"})

    first = await q.get()
    if isinstance(first, BaseException):  # failed before any progress: a real status code
        return err(first)

    async def lines() -> AsyncIterator[bytes]:
        item = first
        while item is not None:
            if isinstance(item, BaseException):
                yield stream_error_line(item)
            else:
                yield _line(item)
            item = await q.get()

    return GenStream(lines(), lambda: None, NDJSON)


@router.post("/api/pull")
async def api_pull(request: Request):
    try:
        data = await read_body(request)
        name = model_field(data)
        from ..store import parse_name, pull_model

        parse_name(name)
        insecure = bool(data.get("insecure"))
    except Exception as exc:  # noqa: BLE001
        return err(exc)

    def work(emit):
        emit({"status": "pulling manifest"})
        pull_model(name, quiet=True, insecure=insecure, progress=_ThreadProgress(emit))
        emit({"status": "verifying sha256 digest"})
        emit({"status": "writing manifest"})

    return await _threaded_progress(request, work, data.get("stream", True) is not False)


@router.post("/api/create")
async def api_create(request: Request):
    try:
        data = await read_body(request)
        name = model_field(data)
        from ..store import create_model, parse_name
        from ..store.modelfile import format_modelfile, parse_modelfile

        parse_name(name)
        if data.get("quantize"):
            raise UsageError("quantize is not supported by ollapy")
        if data.get("adapters"):
            raise UsageError("adapters are not supported by ollapy")
        text = _create_modelfile(data, parse_modelfile, format_modelfile)
    except Exception as exc:  # noqa: BLE001
        return err(exc)

    def work(emit):
        emit({"status": "reading model metadata"})
        create_model(name, text, Path.cwd(), quiet=True)
        emit({"status": "writing manifest"})

    return await _threaded_progress(request, work, data.get("stream", True) is not False)


def _create_modelfile(data: dict, parse_modelfile, format_modelfile) -> str:
    """Modelfile text for /api/create: the legacy ``modelfile`` field, or ``from``/``files`` + fields."""
    from ..store.pull import local_store

    src = data.get("from") or data.get("from_")
    files = data.get("files") or {}
    legacy = data.get("modelfile")
    if legacy:
        mf = parse_modelfile(legacy)
        src = src or mf.from_
        base = {"parameters": mf.parameters, "system": mf.system, "template": mf.template,
                "license": "\n".join(mf.license) or None, "messages": mf.messages}
    else:
        base = {"parameters": {}, "system": None, "template": None, "license": None, "messages": []}
    if files:
        if not isinstance(files, dict):
            raise UsageError("files must map file names to sha256 digests")
        ggufs = [d for f, d in files.items() if str(f).lower().endswith(".gguf")] or list(files.values())
        if len(ggufs) != 1:
            raise UsageError("create from files needs exactly one .gguf file", hint="split GGUFs: create from a path")
        store = local_store()
        try:
            path = store.blob_path(str(ggufs[0]))
        except ValueError:
            raise UsageError(f"bad digest {str(ggufs[0])[:30]!r}") from None
        if not path.is_file():
            raise UsageError(f"blob {str(ggufs[0])[:19]} was not uploaded", hint="POST it to /api/blobs/<digest> first")
        src = str(path)
    if not src:
        raise UsageError("create needs from, files or modelfile")
    params = dict(base["parameters"])
    if isinstance(data.get("parameters"), dict):
        from ..options import coerce_option

        for k, v in data["parameters"].items():
            params[k] = list(coerce_option(k, v)) if k == "stop" else coerce_option(k, v)
    lic = data.get("license")
    if isinstance(lic, list):
        lic = "\n".join(lic)
    return format_modelfile(src, params, data.get("system") or base["system"], data.get("template") or base["template"],
                            lic or base["license"], list(data.get("messages") or base["messages"]))


@router.head("/api/blobs/{digest}")
async def blob_head(digest: str):
    from ..store.pull import local_store

    try:
        exists = local_store().has_blob(digest)
    except ValueError:
        return err(UsageError(f"bad digest {digest[:30]!r}"))
    return Response(status_code=200 if exists else 404)


@router.post("/api/blobs/{digest}")
async def blob_upload(digest: str, request: Request):
    """Store an uploaded blob under ``blobs/`` after checking its sha256 (never anywhere else)."""
    from ..store.layout import digest_hex
    from ..store.pull import local_store

    try:
        hexd = digest_hex(digest)
    except ValueError:
        return err(UsageError(f"bad digest {digest[:30]!r}"))
    store = local_store()
    store.blobs.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store.blobs, prefix=".upload-")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            async for part in request.stream():
                h.update(part)
                await asyncio.to_thread(f.write, part)
        if h.hexdigest() != hexd:
            raise UsageError("digest mismatch", hint="the uploaded bytes do not match the digest in the URL")
        os.replace(tmp, store.blob_path(hexd))
    except Exception as exc:  # noqa: BLE001
        Path(tmp).unlink(missing_ok=True)
        return err(exc)
    return Response(status_code=201)
