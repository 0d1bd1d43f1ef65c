"""Ollama's model-management HTTP API with its field names and semantics.

``/api/pull`` (streamed statuses), ``/api/tags``, ``/api/show``,
``/api/delete``, ``/api/copy``, ``/api/create``, ``/api/blobs/:digest``.
Long-running operations (pull, create) run in a worker thread and stream
their progress as NDJSON; an error after a stream started is its last line,
``{"error": "..."}``. Request bodies are :mod:`ollapy.server.ollama.bodies`; the
shared HTTP helpers live in :mod:`ollapy.server.http`.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ollapy.errors import UsageError
from ollapy.server.bodies import NamedBody, check_name
from ollapy.server.errors import redact_paths
from ollapy.server.http import err, errors_as_json, ndjson_response, read_body, state_of
from ollapy.server.ollama.bodies import CopyBody, CreateBody, PullBody, StoreNameBody
from ollapy.server.ollama.create import create_spec
from ollapy.server.ollama.details import gguf_info, iso_time, model_details, supports_insert
from ollapy.store.adapters import quant_type

router = APIRouter()


# ---- tags / show ----------------------------------------------------------------------------------
@router.get("/api/tags")
@errors_as_json
async def api_tags(request: Request):
    from ollapy.store import list_models

    models = await asyncio.to_thread(list_models)
    out = []
    for m in models:
        if m.broken:
            continue
        path = None
        try:
            layers = m.entry.model_layers()
            if layers:
                from ollapy.store.pull import local_store

                path = local_store().layer_file(layers[0]) if m.store == "ollapy" else None
        except Exception:  # noqa: BLE001
            path = None
        info = await asyncio.to_thread(gguf_info, path)
        out.append({"name": m.name, "model": m.name, "modified_at": iso_time(m.modified), "size": m.size,
                    "digest": m.digest, "details": model_details(info)})  # newest first, as list_models sorts
    return {"models": out}


def projector_fields(ref) -> dict:
    """``projector_info`` (Ollama's field: the projector's type and size) of a vision model, else nothing."""
    path = getattr(ref, "projector", None)
    if not path or not Path(path).exists():
        return {}
    from ollapy.store.info import read_gguf_header

    meta = read_gguf_header(Path(path))[0]
    return {"projector_info": {"clip.projector_type": meta.get("clip.projector_type"),
                               "clip.vision.projection_dim": meta.get("clip.vision.projection_dim"),
                               "general.architecture": meta.get("general.architecture"),
                               "size": Path(path).stat().st_size}}


FIM_TEMPLATE_NOTE = ("{#- fill-in-the-middle: a request with a suffix ({{ .Suffix }}) is laid out with the model's FIM "
                     "tokens: <|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|> -#}\n")
"""What ``/api/show``'s ``template`` starts with for a model that fills in the middle by its FIM tokens."""


def with_insert(caps: list[str], insert: bool) -> list[str]:
    """``caps`` with ``insert`` after ``completion`` and ``tools`` (Ollama's order), when the model has it."""
    if not insert or "completion" not in caps:
        return caps
    at = caps.index("tools") + 1 if "tools" in caps else caps.index("completion") + 1
    return [*caps[:at], "insert", *caps[at:]]


def adapter_fields(ref) -> dict:
    """``adapters`` (ollapy's extra to ``/api/show``): each LoRA adapter's blob digest, size and ``general.name``,
    in the order they are applied; nothing for a model without adapters. Never a path on the server."""
    out = []
    for path in getattr(ref, "adapters", None) or ():
        p = Path(path)
        if not p.exists():
            continue
        from ollapy.store.info import read_gguf_header

        meta = read_gguf_header(p)[0]
        digest = p.name.replace("sha256-", "sha256:", 1) if p.name.startswith("sha256-") else None
        out.append({"digest": digest, "size": p.stat().st_size, "name": meta.get("general.name"),
                    "lora_alpha": meta.get("adapter.lora.alpha")})
    return {"adapters": out} if out else {}


@router.post("/api/show")
@errors_as_json
async def api_show(request: Request):
    name = NamedBody.from_dict(await read_body(request)).model
    check_name(name)
    ref = await state_of(request).runtime.resolve(name)
    info = await asyncio.to_thread(gguf_info, ref.path)
    from ollapy.chat.reply import model_capabilities
    from ollapy.chat.templates import select_template
    from ollapy.store.info import parameter_rows
    from ollapy.store.modelfile import format_modelfile

    params = dict(ref.parameters or {})
    if params.get("draft"):  # a DRAFT given as a file: never a path on the server either
        params["draft"] = redact_paths(str(params["draft"]))
    param_text = "\n".join(f"{k:<30} {text}" for k, text in parameter_rows(params))  # as `ollapy show --parameters`
    arch = info.get("architecture") or ""
    chosen = select_template(info.get("chat_template"), arch, ref.template)  # the one generation uses
    template = chosen.text
    insert = await asyncio.to_thread(supports_insert, ref.path, template)
    if insert and ".Suffix" not in template:
        # Continue (core/llm/llms/Ollama.ts) sends `suffix` only when the template names `.Suffix`, as Ollama's Go
        # templates of FIM models do; ollapy lays a suffix out with the model's FIM tokens, so it says so in a
        # Jinja comment (the template renders as before)
        template = FIM_TEMPLATE_NOTE + template
    model_info = {"general.architecture": arch, "general.parameter_count": info.get("parameter_count"),
                  f"{arch}.context_length": info.get("context_length"),
                  f"{arch}.embedding_length": info.get("embedding_length")}
    return {
        # FROM the model's name, never the blob's path on the server (a client can create from the name)
        "modelfile": format_modelfile(ref.name, params, ref.system, ref.template, ref.license,
                                      list(ref.messages or []),
                                      [Path(a).name for a in getattr(ref, "adapters", None) or ()]),
        "parameters": param_text,
        "template": template,
        "template_source": chosen.source,  # ollapy's extra: gguf tokenizer.chat_template, modelfile or a fallback
        "system": ref.system or "",
        "license": ref.license or "",
        "details": model_details(info),
        "model_info": {k: v for k, v in model_info.items() if v is not None},
        "messages": list(ref.messages or []),
        # as Ollama: completion (or embedding), tools, thinking; from the GGUF header, the model is not loaded
        "capabilities": with_insert(model_capabilities(template, embedding_only=bool(info.get("embedding_only"))),
                                    insert) + (["vision"] if getattr(ref, "projector", None) else []),
        **projector_fields(ref),
        **adapter_fields(ref),
        "modified_at": iso_time(Path(ref.path).stat().st_mtime if Path(ref.path).exists() else None),
    }


# ---- delete / copy ------------------------------------------------------------------------------
@router.delete("/api/delete")
@errors_as_json
async def api_delete(request: Request):
    name = StoreNameBody.from_dict(await read_body(request)).model
    from ollapy.store import remove_model

    await state_of(request).runtime.unload(name)
    await asyncio.to_thread(remove_model, name)
    return Response(status_code=200)


@router.post("/api/copy")
@errors_as_json
async def api_copy(request: Request):
    body = CopyBody.from_dict(await read_body(request))
    src, dst = body.source, body.destination
    from ollapy.store import copy_model, parse_name

    parse_name(src)
    parse_name(dst)
    await asyncio.to_thread(copy_model, src, dst)
    return Response(status_code=200)


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

    def put(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the loop closed: the client (and the route) went away, nobody reads statuses
            pass

    def emit(obj: dict) -> None:
        put(obj)

    def run() -> None:
        try:
            work(emit)
            emit({"status": "success"})
        except BaseException as exc:  # noqa: BLE001
            put(exc)
        finally:
            put(None)

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

    async def statuses() -> AsyncIterator[dict]:
        item = first
        while item is not None:
            if isinstance(item, BaseException):  # the stream's last line, {"error": ...}
                raise item if isinstance(item, Exception) else RuntimeError(f"interrupted: {item!r}")
            yield item
            item = await q.get()

    return ndjson_response(statuses(), lambda: None)


@router.post("/api/pull")
async def api_pull(request: Request):
    try:
        body = PullBody.from_dict(await read_body(request))
    except Exception as exc:  # noqa: BLE001
        return err(exc)

    def work(emit):
        from ollapy.store import pull_model

        emit({"status": "pulling manifest"})
        pull_model(body.model, quiet=True, insecure=body.insecure, progress=_ThreadProgress(emit))
        emit({"status": "verifying sha256 digest"})
        emit({"status": "writing manifest"})

    return await _threaded_progress(request, work, body.stream)


@router.post("/api/create")
async def api_create(request: Request):
    try:
        body = CreateBody.from_dict(await read_body(request))
        spec = create_spec(body, state_of(request).runtime.allow_paths)  # from the fields: no Modelfile text
        qname = body.quantize or body.quantization
        qtype = quant_type(qname) if qname else None
        if qtype is not None and Path(spec.from_).is_file():  # an uploaded blob: refused before the stream starts
            from ollapy.store.adapters import check_quantizable

            await asyncio.to_thread(check_quantizable, Path(spec.from_))
    except Exception as exc:  # noqa: BLE001
        return err(exc)

    def work(emit):
        from ollapy.store import create_model

        emit({"status": "reading model metadata"})
        quantize = None
        if qtype is not None:
            from ollapy.engine.system import quantize_model

            status = f"quantizing model to {qtype.upper()}"

            def progress(done: int, total: int) -> None:  # Ollama's create progress: tensors done of total
                emit({"status": status, "digest": "0", "total": total, "completed": done})

            quantize = (qtype, quantize_model, progress)
        with tempfile.TemporaryDirectory(prefix="ollapy-create-") as nowhere:  # FROM never resolves against the cwd
            create_model(body.model, spec, Path(nowhere), quiet=True, quantize=quantize)
        emit({"status": "writing manifest"})

    return await _threaded_progress(request, work, body.stream)


@router.head("/api/blobs/{digest}")
async def blob_head(digest: str):
    from ollapy.store.pull import local_store

    try:
        exists = local_store().has_blob(digest)
    except ValueError:
        return err(UsageError(f"bad digest {digest[:30]!r}"))
    return Response(status_code=200 if exists else 404)


@router.post("/api/blobs/{digest}")
async def blob_upload(digest: str, request: Request):
    """Store an uploaded blob under ``blobs/`` after checking its sha256 (never anywhere else).

    The bytes go to a temp file (``blobs/.upload-*``) renamed into place when the digest matches; every other exit
    (digest mismatch, client gone, the request cancelled at shutdown, any exception) removes it in a ``finally``.
    A file a killed process left is swept at the next start (:func:`sweep_uploads`)."""
    from ollapy.store.layout import digest_hex
    from ollapy.store.pull import local_store

    try:
        hexd = digest_hex(digest)
    except ValueError:
        return err(UsageError(f"bad digest {digest[:30]!r}"))
    store = local_store()
    store.blobs.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store.blobs, prefix=UPLOAD_PREFIX)
    h = hashlib.sha256()
    stored = False
    try:
        with os.fdopen(fd, "wb") as f:
            async for part in request.stream():
                h.update(part)
                await asyncio.to_thread(f.write, part)
        if h.hexdigest() != hexd:
            raise UsageError("digest mismatch", hint="the uploaded bytes do not match the digest in the URL")
        os.replace(tmp, store.blob_path(hexd))
        stored = True
    except Exception as exc:  # noqa: BLE001
        return err(exc)
    finally:
        if not stored:
            Path(tmp).unlink(missing_ok=True)
    return Response(status_code=201)


UPLOAD_PREFIX = ".upload-"
STALE_UPLOAD_S = 3600
"""Age (seconds since its last write) past which an upload's temp file is one a killed process left: an upload in
flight (this process's or another's sharing the store) writes to it far more often."""


def sweep_uploads(blobs: Path, now: float | None = None) -> int:
    """Remove the upload temp files in ``blobs`` not written for :data:`STALE_UPLOAD_S` seconds (left by a process
    that was killed mid-upload); returns how many. Called when the server starts."""
    now = time.time() if now is None else now
    n = 0
    for p in blobs.glob(UPLOAD_PREFIX + "*") if blobs.is_dir() else ():
        try:
            if now - p.stat().st_mtime > STALE_UPLOAD_S:
                p.unlink()
                n += 1
        except FileNotFoundError:
            pass
    return n
