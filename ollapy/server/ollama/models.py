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
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ollapy.errors import OptionError, UsageError
from ollapy.server.bodies import NamedBody, check_name
from ollapy.server.errors import redact_paths
from ollapy.server.http import err, errors_as_json, ndjson_response, read_body, state_of
from ollapy.server.ollama.bodies import CopyBody, CreateBody, PullBody, StoreNameBody
from ollapy.server.ollama.details import gguf_info, iso_time, model_details

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
    model_info = {"general.architecture": arch, "general.parameter_count": info.get("parameter_count"),
                  f"{arch}.context_length": info.get("context_length"),
                  f"{arch}.embedding_length": info.get("embedding_length")}
    return {
        # FROM the model's name, never the blob's path on the server (a client can create from the name)
        "modelfile": format_modelfile(ref.name, params, ref.system, ref.template, ref.license,
                                      list(ref.messages or [])),
        "parameters": param_text,
        "template": template,
        "template_source": chosen.source,  # ollapy's extra: gguf tokenizer.chat_template, modelfile or a fallback
        "system": ref.system or "",
        "license": ref.license or "",
        "details": model_details(info),
        "model_info": {k: v for k, v in model_info.items() if v is not None},
        "messages": list(ref.messages or []),
        # as Ollama: completion (or embedding), tools, thinking; from the GGUF header, the model is not loaded
        "capabilities": model_capabilities(template, embedding_only=bool(info.get("embedding_only")))
        + (["vision"] if getattr(ref, "projector", None) else []),
        **projector_fields(ref),
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
        from ollapy.store.modelfile import format_modelfile, parse_modelfile

        text = _create_modelfile(body, parse_modelfile, format_modelfile, state_of(request).runtime.allow_paths)
    except Exception as exc:  # noqa: BLE001
        return err(exc)

    def work(emit):
        from ollapy.store import create_model

        emit({"status": "reading model metadata"})
        with tempfile.TemporaryDirectory(prefix="ollapy-create-") as nowhere:  # FROM never resolves against the cwd
            create_model(body.model, text, Path(nowhere), quiet=True)
        emit({"status": "writing manifest"})

    return await _threaded_progress(request, work, body.stream)


CREATE_PATHS_REFUSED = "create takes a model name or an uploaded blob, not a file path on the server"
CREATE_PATHS_HINT = ("upload the GGUF with POST /api/blobs/sha256:<digest> and pass files={name: digest}, "
                     "or start the server with `ollapy serve --allow-paths` for absolute paths")


def _blob_file(digest: str) -> str:
    """The store file of an uploaded blob (``sha256:<hex>``, ``sha256-<hex>``, ``@sha256:<hex>``); UsageError when
    the digest is malformed or the blob was not uploaded (only the blob store is consulted, never other paths)."""
    from ollapy.store.pull import local_store

    try:
        path = local_store().blob_path(str(digest).strip().removeprefix("@"))
    except ValueError:
        raise UsageError(f"bad digest {str(digest)[:30]!r}", hint="use sha256:<64 hex digits>") from None
    if not path.is_file():
        raise UsageError(f"blob {str(digest).removeprefix('@')[:19]} was not uploaded",
                         hint="POST it to /api/blobs/<digest> first")
    return str(path)


def create_source(src: str, allow_paths: bool) -> str:
    """The FROM of an /api/create request as ``create_model`` takes it.

    A digest (``sha256:<hex>``, ``@sha256:<hex>``) becomes its uploaded blob's
    file; a store name stays as it is; an absolute path passes only with
    ``serve --allow-paths``. Any other path (relative, ``~``, ``../x.gguf``,
    ``/etc/passwd`` without the flag) raises PathNotAllowed with the same
    message whether or not the file exists: nothing on disk is looked at.
    """
    from ollapy.errors import PathNotAllowed
    from ollapy.runner.loader import is_path_like, is_path_name
    from ollapy.store import parse_name

    text = str(src).strip()
    if re.fullmatch(r"@?sha256[:-][0-9a-fA-F]{64}", text):
        return _blob_file(text)
    if is_path_like(text):
        if allow_paths and is_path_name(text):
            return text
        raise PathNotAllowed(CREATE_PATHS_REFUSED, hint=CREATE_PATHS_HINT)
    parse_name(text)
    return text


def _create_modelfile(body: CreateBody, parse_modelfile, format_modelfile, allow_paths: bool = False) -> str:
    """Modelfile text for /api/create: the legacy ``modelfile`` field, or ``from``/``files`` + fields.

    FROM is checked by :func:`create_source` (store names and uploaded blobs;
    absolute paths only with ``allow_paths``). Raises UsageError/PathNotAllowed.
    """
    src = body.source
    files = body.files or {}
    legacy = body.modelfile
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
        src = _blob_file(str(ggufs[0]))
    elif src:
        if not isinstance(src, str):
            raise UsageError("from must be a model name or a blob digest")
        src = create_source(src, allow_paths)
    if not src:
        raise UsageError("create needs from, files or modelfile")
    params = dict(base["parameters"])
    if isinstance(body.parameters, dict):
        from ollapy.options import LIST_OPTIONS, REQUEST_ONLY_OPTIONS, coerce_option

        for k, v in body.parameters.items():
            if k in REQUEST_ONLY_OPTIONS:
                raise OptionError(f"parameter {k} cannot be part of a model", hint="send it with each request")
            params[k] = list(coerce_option(k, v)) if k in LIST_OPTIONS else coerce_option(k, v)
    if isinstance(params.get("draft"), str):  # DRAFT lines and parameters.draft: no server paths either
        from ollapy.options import draft_model
        from ollapy.server.scheduler import DRAFT_PATHS_REFUSED, check_server_path

        check_server_path(draft_model(params["draft"]) or "", allow_paths, DRAFT_PATHS_REFUSED,
                          "name a draft model from `ollapy list`, or start the server with `ollapy serve "
                          "--allow-paths` for absolute paths")
    lic = body.license
    if isinstance(lic, list):
        lic = "\n".join(lic)
    return format_modelfile(src, params, body.system or base["system"], body.template or base["template"],
                            lic or base["license"], list(body.messages or base["messages"]))


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
    """Store an uploaded blob under ``blobs/`` after checking its sha256 (never anywhere else)."""
    from ollapy.store.layout import digest_hex
    from ollapy.store.pull import local_store

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
