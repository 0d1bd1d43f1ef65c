"""``/api/create``'s request as a model configuration: a :class:`~ollapy.store.modelfile.Modelfile` object built
from the JSON fields themselves, never written out as Modelfile text and parsed again.

A field's value is data, whatever it holds (a newline, triple quotes, ``FROM /etc/passwd``, a NUL): no value can
become an instruction. Only the legacy ``modelfile`` field is Modelfile text, and it is parsed once.

Every file the configuration names passes one rule (:func:`create_source`): an uploaded blob (``sha256:<hex>``,
looked up only in the store's ``blobs/``), a store model name, or an absolute path when the server runs with
``serve --allow-paths``. Any other path is refused with the same words whether or not it exists, before anything on
disk is looked at: no answer tells a client whether a server file exists.

``adapters`` (``{file name: blob digest}``) and the legacy ``modelfile``'s ``ADAPTER`` lines name LoRA adapter GGUFs
under the same rule (a blob, or an absolute path with ``--allow-paths``); ``quantize`` is checked by the route.

``files`` holds the model's GGUF and, for a vision model, its projector, as Ollama's client sends them: each
uploaded blob's GGUF header decides which is which, as Ollama's ``server/create.go`` does (``general.architecture``
``clip`` or ``general.type`` ``mmproj``/``projector``: the projector).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ollapy.errors import PathNotAllowed, UsageError
from ollapy.server.ollama.bodies import CreateBody
from ollapy.store.modelfile import ROLES, Modelfile, parse_modelfile

CREATE_PATHS_REFUSED = "create takes a model name or an uploaded blob, not a file path on the server"
CREATE_PATHS_HINT = ("upload the GGUF with POST /api/blobs/sha256:<digest> and pass files={name: digest}, "
                     "or start the server with `ollapy serve --allow-paths` for absolute paths")
PROJECTOR_REFUSED = "a projector is an uploaded blob, not a model name or a file path on the server"
PROJECTOR_HINT = ("upload the mmproj GGUF with POST /api/blobs/sha256:<digest> and pass it in files next to the "
                  "model, or FROM @sha256:<digest> as the second FROM")
ADAPTER_REFUSED = "an adapter is an uploaded blob, not a model name or a file path on the server"
ADAPTER_HINT = ("upload the LoRA GGUF with POST /api/blobs/sha256:<digest> and pass adapters={name: digest}, "
                "or ADAPTER @sha256:<digest> in the modelfile")
_DIGEST = re.compile(r"@?sha256[:-][0-9a-fA-F]{64}")


def blob_file(digest: str) -> str:
    """The store file of an uploaded blob (``sha256:<hex>``, ``sha256-<hex>``, ``@sha256:<hex>``).

    Only the blob store is consulted, never another path. Raises UsageError when the digest is malformed or the
    blob was not uploaded."""
    from ollapy.store.pull import local_store

    try:
        path = local_store().blob_path(str(digest).strip().removeprefix("@"))
    except ValueError:
        raise UsageError(f"bad digest {str(digest)[:30]!r}", hint="use sha256:<64 hex digits>") from None
    if not path.is_file():
        raise UsageError(f"blob {str(digest).removeprefix('@')[:19]} was not uploaded",
                         hint="POST it to /api/blobs/<digest> first")
    return str(path)


def create_source(src: Any, allow_paths: bool, *, projector: bool = False, adapter: bool = False) -> str:
    """A FROM of an /api/create request (``from``, a ``modelfile``'s FROM lines) as ``create_model`` takes it.

    A digest (``sha256:<hex>``, ``@sha256:<hex>``) becomes its uploaded blob's file; a store name stays as it is
    (not for a ``projector``, which is a file); an absolute path passes only with ``serve --allow-paths``. Any
    other path (relative, ``~``, ``../x.gguf``, ``/etc/passwd`` without the flag) raises PathNotAllowed with the
    same message whether or not the file exists: nothing on disk is looked at. A non-string is a UsageError.
    """
    from ollapy.runner.loader import is_path_like, is_path_name
    from ollapy.store import parse_name

    if not isinstance(src, str) or not src.strip():
        raise UsageError("from must be a model name or a blob digest", hint='send "from": "NAME" or "sha256:<hex>"')
    text = src.strip()
    if _DIGEST.fullmatch(text):
        return blob_file(text)
    if "\x00" in text:
        raise UsageError("from holds a NUL character", hint="send a model name or a blob digest")
    refused, hint = ((ADAPTER_REFUSED, ADAPTER_HINT) if adapter else (PROJECTOR_REFUSED, PROJECTOR_HINT) if projector
                     else (CREATE_PATHS_REFUSED, CREATE_PATHS_HINT))
    if is_path_like(text):
        if allow_paths and is_path_name(text):
            return text
        raise PathNotAllowed(refused, hint=hint)
    if projector or adapter:
        raise PathNotAllowed(refused, hint=hint)
    parse_name(text)
    return text


def is_projector_file(path: str) -> bool:
    """True when the GGUF at ``path`` (an uploaded blob) is a vision projector (mmproj): ``general.architecture``
    ``clip``, or ``general.type`` ``mmproj``/``projector`` (Ollama's ``isProjectorGGUF``). A file whose header does
    not parse is not one (``create_model`` then says why it is no model either)."""
    from ollapy.errors import ModelLoadError
    from ollapy.store.info import read_gguf_header

    try:
        meta = read_gguf_header(Path(path))[0]
    except ModelLoadError:
        return False
    return meta.get("general.architecture") == "clip" or meta.get("general.type") in ("mmproj", "projector")


def files_sources(files: Any) -> tuple[str, str]:
    """``files`` (``{file name: blob digest}``) as ``(model blob, projector blob or "")``.

    Raises UsageError unless it holds one model GGUF and at most one projector, each an uploaded blob."""
    if not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
        raise UsageError("files must map file names to sha256 digests", hint='send {"model.gguf": "sha256:<hex>"}')
    if len(files) > 2:
        raise UsageError(f"files holds {len(files)} files; ollapy takes one GGUF model and its projector",
                         hint="split GGUFs and safetensors are not supported: send one .gguf file (and an mmproj)")
    paths = [blob_file(d) for d in files.values()]
    projectors = [p for p in paths if is_projector_file(p)]
    models = [p for p in paths if p not in projectors]
    if len(projectors) > 1:
        raise UsageError("files holds two vision projectors", hint="send the model's GGUF and one mmproj GGUF")
    if not models:
        raise UsageError("files holds a vision projector (mmproj) but no model",
                         hint="send the model's GGUF too: files={model.gguf: digest, mmproj.gguf: digest}")
    if len(models) > 1:
        raise UsageError("files holds two models", hint="send one model GGUF (and its mmproj projector)")
    return models[0], projectors[0] if projectors else ""


def create_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` of /api/create as the model's MESSAGE list: ``[{"role", "content"}]`` with a role of
    :data:`~ollapy.store.modelfile.ROLES` and a string content. Raises UsageError naming the bad message."""
    if not isinstance(messages, list):
        raise UsageError("messages must be a list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise UsageError(f"messages.{i} must be an object with role and content")
        role, content = m.get("role"), m.get("content", "")
        if role not in ROLES:
            raise UsageError(f"messages.{i}.role must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise UsageError(f"messages.{i}.content must be a string")
        out.append({"role": role, "content": content})
    return out


def create_parameters(parameters: Any) -> dict[str, Any]:
    """``parameters`` of /api/create, each value typed by :func:`~ollapy.options.coerce_option` (``stop`` and
    ``dry_sequence_breakers`` lists). Raises OptionError naming the parameter, also for one that belongs to a
    request only (``logit_bias``: token ids are a request's, not a model's)."""
    from ollapy.errors import OptionError
    from ollapy.options import LIST_OPTIONS, REQUEST_ONLY_OPTIONS, coerce_option

    if not isinstance(parameters, dict):
        raise UsageError("parameters must be an object of option names and values")
    for k in parameters:
        if k in REQUEST_ONLY_OPTIONS:
            raise OptionError(f"parameter {k} cannot be part of a model", hint="send it with each request")
    return {k: list(coerce_option(k, v)) if k in LIST_OPTIONS else coerce_option(k, v) for k, v in parameters.items()}


def create_spec(body: CreateBody, allow_paths: bool = False) -> Modelfile:
    """The model configuration an /api/create request asks for, built from its fields (never from text).

    The legacy ``modelfile`` is parsed once and its values are the base; ``from``/``files``, ``parameters``,
    ``system``, ``template``, ``license`` and ``messages`` override them. Every FROM (and DRAFT) passes
    :func:`create_source`'s rule. Raises UsageError, OptionError or PathNotAllowed (400s).
    """
    mf = parse_modelfile(body.modelfile) if body.modelfile else Modelfile()
    spec = Modelfile(parameters=dict(mf.parameters), system=mf.system, template=mf.template,
                     license=list(mf.license), messages=list(mf.messages))
    if body.files:
        spec.from_, spec.projector = files_sources(body.files)
    elif body.source is not None or mf.from_:
        spec.from_ = create_source(body.source if body.source is not None else mf.from_, allow_paths)
    else:
        raise UsageError("create needs from, files or modelfile", hint='send "from": "NAME" or files={...}')
    if mf.projector and not spec.projector:
        spec.projector = create_source(mf.projector, allow_paths, projector=True)
    if body.parameters is not None:
        spec.parameters.update(create_parameters(body.parameters))
    if body.system is not None:
        spec.system = body.system
    if body.template is not None:
        spec.template = body.template
    if body.license is not None:
        spec.license = [body.license] if isinstance(body.license, str) else list(body.license)
    if body.messages is not None:
        spec.messages = create_messages(body.messages)
    # LoRA adapters: uploaded blobs ({file name: digest}, Ollama's client), or the legacy modelfile's ADAPTER lines
    # under the same rule as every FROM (a blob digest, or an absolute path with --allow-paths)
    if body.adapters is not None:
        if not isinstance(body.adapters, dict) or not all(isinstance(d, str) for d in body.adapters.values()):
            raise UsageError("adapters must map file names to sha256 digests",
                             hint='send {"lora.gguf": "sha256:<hex>"} after uploading the adapter as a blob')
        spec.adapters = [blob_file(d) for d in body.adapters.values()]
    else:
        spec.adapters = [create_source(a, allow_paths, adapter=True) for a in mf.adapters]
    draft = spec.parameters.get("draft")
    if isinstance(draft, str):  # DRAFT lines and parameters.draft: no server paths either
        from ollapy.options import draft_model
        from ollapy.server.scheduler import DRAFT_PATHS_REFUSED, check_server_path

        check_server_path(draft_model(draft) or "", allow_paths, DRAFT_PATHS_REFUSED,
                          "name a draft model from `ollapy list`, or start the server with `ollapy serve "
                          "--allow-paths` for absolute paths")
    return spec
