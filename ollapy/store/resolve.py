"""Turning a name into a loadable model (:func:`resolve_model`), and listing, removing and copying models."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ollapy.errors import CorruptManifest, ModelNotFound, UsageError
from ollapy.store import catalogue
from ollapy.store.layout import (
    MT_ADAPTER,
    MT_LICENSE,
    MT_MESSAGES,
    MT_MODEL,
    MT_PARAMS,
    MT_PROJECTOR,
    MT_SYSTEM,
    MT_TEMPLATE,
    Entry,
    Store,
    digest_hex,
)
from ollapy.store.modelfile import Modelfile
from ollapy.store.names import ModelName, looks_like_path, parse_name
from ollapy.store.ollama_store import ollama_store
from ollapy.store.pull import local_store, not_found, pull_model

log = logging.getLogger("ollapy.store")


@dataclass
class ModelRef:
    """A model ready to load: ``path`` is the GGUF (the first part of a split); ``digest`` its sha256 hex.

    ``parameters`` maps Ollama option names to values; ``messages`` are
    ``{"role", "content"}`` dicts from MESSAGE lines.
    """

    name: str
    path: Path
    digest: str | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict[str, object] = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)
    license: str | None = None
    source: str | None = None
    projector: Path | None = None  # a vision model's projector GGUF (the manifest's projector layer)
    adapters: list[Path] = field(default_factory=list)  # LoRA adapter GGUFs (the manifest's adapter layers, in order)


@dataclass
class ModelInfo:
    """One row of ``ollapy list``: size in bytes, modified as a POSIX timestamp, ``broken`` = reason or None.

    ``digest`` is the manifest's sha256 (64 hex, :func:`manifest_digest`), the one model ID that ``list``,
    ``ps``, ``/api/tags`` and ``/api/ps`` show; ``id`` is its first 12 hex digits.
    """

    name: str
    id: str
    size: int
    modified: float
    source: str
    store: str
    broken: str | None
    entry: Entry
    digest: str = ""


def _text(store: Store, layer: dict[str, Any]) -> str:
    return store.layer_file(layer).read_text(encoding="utf-8")


def _runnable_template(name: str, text: str) -> str | None:
    """A stored TEMPLATE as the engine can use it: Jinja as is; a Go template (a model pulled from an
    Ollama registry, or created before translation existed) translated; None when it cannot be, so the
    GGUF's own chat template applies (logged; ``run --verbose`` and ``show`` name the template used)."""
    from ollapy.chat.gotemplate import jinja_template
    from ollapy.errors import UsageError

    try:
        return jinja_template(text)
    except UsageError as exc:
        log.info("model %s: %s; using the GGUF's chat template", name, exc)
        return None


def ref_from_entry(store: Store, entry: Entry, links: Store) -> ModelRef:
    """Build a ModelRef from a valid manifest entry; ``links`` is the writable store for split-GGUF links."""
    if entry.broken or entry.manifest is None:
        raise CorruptManifest(f"model {entry.display()!r} is broken: {entry.broken}",
                              hint=f"remove it with `ollapy rm {entry.display()}` and pull it again")
    layers = entry.model_layers()
    if len(layers) > 1:
        links_layers = [dict(x, **({"from": str(store.layer_file(x))} if store is not links else {})) for x in layers]
        path = links.split_path(links_layers)
    else:
        path = store.layer_file(layers[0])
    ref = ModelRef(name=entry.display(), path=path, digest=digest_hex(layers[0]["digest"]),
                   source=(entry.manifest.get("ollapy") or {}).get("source") or ("ollama" if store.read_only else None))
    for layer in entry.manifest["layers"]:
        mt = layer.get("mediaType")
        try:
            if mt == MT_TEMPLATE:
                ref.template = _runnable_template(entry.display(), _text(store, layer))
            elif mt == MT_SYSTEM:
                ref.system = _text(store, layer)
            elif mt == MT_LICENSE:
                ref.license = (ref.license + "\n" if ref.license else "") + _text(store, layer)
            elif mt == MT_PARAMS:
                ref.parameters = dict(json.loads(_text(store, layer)))
            elif mt == MT_MESSAGES:
                ref.messages = list(json.loads(_text(store, layer)))
            elif mt == MT_PROJECTOR:
                ref.projector = store.layer_file(layer)
            elif mt == MT_ADAPTER:
                ref.adapters.append(store.layer_file(layer))
        except (OSError, ValueError, TypeError) as exc:
            raise CorruptManifest(f"model {entry.display()!r} has an unreadable {mt.rsplit('.', 1)[-1]} layer: {exc}",
                                  hint=f"remove it with `ollapy rm {entry.display()}`") from None
    return ref


def find_entry(name: ModelName) -> tuple[Store, Entry] | None:
    """Look ``name`` up in the local store, then the Ollama store; ``latest`` falls back to the catalogue default."""
    candidates = [name]
    entry = catalogue.lookup(name)
    if entry is not None and entry.tag != name.tag.lower():
        candidates.append(name.with_tag(entry.tag))
    own = local_store()
    stores = [s for s in (own, ollama_store(exclude=own.root)) if s is not None]
    for cand in candidates:
        for store in stores:
            found = store.find(cand)
            if found is not None:
                return store, found
    return None


def resolve_model(name: str, *, pull: bool = True, quiet: bool = False) -> ModelRef:
    """Resolve a name or ``.gguf`` path to a :class:`ModelRef`, pulling a missing model when ``pull``.

    Raises InvalidModelName, ModelNotFound (names where it looked), CorruptManifest, DownloadError.
    """
    if looks_like_path(name):
        p = Path(name).expanduser()
        if p.is_file():
            return ModelRef(name=str(p), path=p)
        raise ModelNotFound(f"{name}: no such file", hint="check the path, or use a model name from `ollapy list`")
    parsed = parse_name(name)
    found = find_entry(parsed)
    if found is None:
        if not pull:
            raise not_found(parsed)
        parsed = pull_model(name, quiet=quiet)
        found = find_entry(parsed)
        if found is None:
            raise not_found(parsed)
    store, entry = found
    return ref_from_entry(store, entry, local_store())


def manifest_digest(path: Path) -> str:
    """The manifest's sha256 (64 hex digits): a model's ID, shown as its first 12 digits as Ollama does.

    ollapy's own bookkeeping inside a manifest (``ollapy``: the name and the
    source it came from) is left out, so the ID names the content: a ``cp``
    keeps it, as in Ollama, and so does pulling the same blob again from another
    source. Manifests without that block (Ollama's store) are hashed as they are.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return "?" * 64
    try:
        manifest = json.loads(data)
        if isinstance(manifest, dict) and "ollapy" in manifest:
            del manifest["ollapy"]
            data = json.dumps(manifest, indent=2).encode("utf-8")
    except ValueError:
        pass
    return hashlib.sha256(data).hexdigest()


def list_models() -> list[ModelInfo]:
    """Every model in the local store and those only in the Ollama store, newest first (by the manifest's
    modified time, as Ollama sorts ``list`` and ``/api/tags``); broken entries included."""
    out: list[ModelInfo] = []
    own = local_store()
    seen = set()
    for label, store in (("ollapy", own), ("ollama", ollama_store(exclude=own.root))):
        if store is None:
            continue
        for e in store.entries():
            if label == "ollama" and e.parts in seen:
                continue
            seen.add(e.parts)
            layers = (e.manifest or {}).get("layers", [])
            size = sum(int(x.get("size") or 0) for x in layers if isinstance(x, dict))
            src = ((e.manifest or {}).get("ollapy") or {}).get("source") or label
            digest = manifest_digest(e.path)
            out.append(ModelInfo(e.display(), digest[:12], size, e.modified, src, label, e.broken, e, digest))
    out.sort(key=lambda m: (-m.modified, m.name))
    return out


def remove_model(name: str) -> list[Path]:
    """Remove a model (broken ones too) from the local store; return blobs deleted. Raises ModelNotFound."""
    parsed = parse_name(name)
    own = local_store()
    entry = own.find(parsed)
    if entry is None:
        other = ollama_store(exclude=own.root)
        if other is not None and other.find(parsed) is not None:
            raise ModelNotFound(f"{parsed.display()!r} is in the Ollama store {other.root}, which ollapy only reads",
                                hint="remove it with `ollama rm`")
        raise ModelNotFound(f"model {parsed.display()!r} not found in {own.root}", hint="run `ollapy list`")
    return own.remove(entry)


def copy_model(src: str, dst: str) -> ModelName:
    """Copy a model's manifest to a new name (no blob is copied). Raises ModelNotFound or CorruptManifest."""
    s, d = parse_name(src), parse_name(dst)
    found = find_entry(s)
    if found is None:
        raise not_found(s)
    store, entry = found
    if entry.broken or entry.manifest is None:
        raise CorruptManifest(f"model {entry.display()!r} is broken: {entry.broken}", hint="remove it and pull it again")
    manifest = json.loads(json.dumps(entry.manifest))
    if store.read_only:  # refer to the Ollama blobs in place
        for layer in manifest["layers"]:
            layer["from"] = str(store.layer_file(layer))
    own = local_store()
    own.write_manifest(d, manifest)
    return d


def create_model(name: str, modelfile: str | Modelfile, base_dir: Path, quiet: bool = False, *,
                 quantize: tuple[str, Any, Any] | None = None) -> ModelRef:
    """Register a model from a Modelfile (FROM path resolved against ``base_dir``) without copying the GGUF.

    ``modelfile`` is Modelfile text (a user's file, parsed here once) or a :class:`Modelfile` built by a caller
    from structured fields (``/api/create``'s JSON: no text round trip, so no value can become an instruction).
    The GGUF is hard-linked into the store where possible, otherwise referenced
    by path (``show`` reports it). ``ADAPTER`` files are checked and linked the same way
    (:mod:`ollapy.store.adapters`). ``quantize`` = ``(type, quantizer, progress)``: the model GGUF (F16/F32 only)
    is quantized by ``quantizer`` (:class:`~ollapy.store.adapters.Quantizer`) into a new blob that replaces the
    model layer. Raises UsageError, ModelNotFound, ModelLoadError.
    """
    from ollapy.chat.gotemplate import jinja_template
    from ollapy.store.adapters import adapter_layer, model_architecture, quantized_layer
    from ollapy.store.modelfile import parse_modelfile
    from ollapy.store.pull import extra_layers

    target = parse_name(name)
    mf = parse_modelfile(modelfile) if isinstance(modelfile, str) else modelfile
    assert isinstance(mf, Modelfile) and mf.from_, "a Modelfile names its FROM"
    template = jinja_template(mf.template) if mf.template else None  # Ollama's Go templates become Jinja
    own = local_store()
    src_path = Path(mf.from_).expanduser()
    if not src_path.is_absolute():
        src_path = base_dir / src_path
    if src_path.is_file():
        _check_model_file(src_path, mf.from_)
        # a source that is quantized is read in place, never linked into the store: only its quantized copy is
        source_layer = ({"mediaType": MT_MODEL, "from": str(src_path.resolve()), "digest": "sha256:" + "0" * 64}
                        if quantize is not None else _file_layer(own, src_path, MT_MODEL))
        layers, base = [source_layer], ModelRef(name=str(src_path), path=src_path)
        source = f"created from {src_path.resolve()}"
    else:
        base = resolve_model(mf.from_, pull=True, quiet=quiet)
        found = find_entry(parse_name(base.name))
        assert found is not None
        store, entry = found
        layers = [dict(x, **({"from": str(store.layer_file(x))} if store.read_only else {})) for x in entry.model_layers()]
        # a vision model's projector comes along (unless a second FROM names another), and so do its adapters
        layers += [dict(x, **({"from": str(store.layer_file(x))} if store.read_only else {}))
                   for x in entry.manifest["layers"]
                   if (x.get("mediaType") == MT_PROJECTOR and not mf.projector) or x.get("mediaType") == MT_ADAPTER]
        source = f"created from {base.name}"
    if mf.projector:
        layers.append(_projector_layer(own, mf.projector, base_dir))
    if quantize is not None:
        model_layers = [x for x in layers if x.get("mediaType") == MT_MODEL]
        if len(model_layers) != 1:
            raise UsageError("quantization needs a model in one GGUF file", hint="merge a split GGUF first")
        qtype, quantizer, progress = quantize
        qlayer = quantized_layer(own, own.layer_file(model_layers[0]), qtype, quantizer, progress)
        layers = [qlayer if x is model_layers[0] else x for x in layers]
    if mf.adapters:
        arch = model_architecture(base.path)
        layers = [x for x in layers if x.get("mediaType") != MT_ADAPTER]  # the Modelfile's adapters replace the base's
        for given in mf.adapters:
            path = Path(given).expanduser()
            layers.append(adapter_layer(own, path if path.is_absolute() else base_dir / path, given, arch))
    params = dict(base.parameters) | mf.parameters
    draft = params.get("draft", "")
    if draft and draft != "ngram" and not Path(draft).expanduser().is_absolute() and (base_dir / draft).is_file():
        params["draft"] = str((base_dir / draft).resolve())  # DRAFT ./file.gguf: relative to the Modelfile, as FROM
    _check_runnable(params, base)
    layers += extra_layers(own, template=template or base.template, system=mf.system or base.system, params=params,
                           license="\n".join(mf.license) or base.license, messages=mf.messages or base.messages)
    own.write_manifest(target, {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                                "layers": layers, "ollapy": {"source": source}})
    return resolve_model(target.display(), pull=False)


def _check_model_file(path: Path, given: str) -> None:
    """Refuse a FROM file that is not a model GGUF before anything is stored (as ``ollama create`` refuses an
    unreadable model): a file whose GGUF header does not parse (random bytes, a truncated download, another
    format) or a vision projector (mmproj) named as the model. Raises ModelLoadError (exit 1, a 400 over HTTP),
    as for a missing file."""
    from ollapy.errors import ModelLoadError
    from ollapy.store.info import read_gguf_header

    try:
        arch = read_gguf_header(path)[0].get("general.architecture")
    except ModelLoadError as exc:  # read_gguf_header chains the parser's own error: the reason
        why = str(exc.__cause__) if exc.__cause__ is not None else "unreadable header"
        raise ModelLoadError(f"FROM {given}: not a GGUF model file ({why})",
                         hint="FROM names a model's .gguf file (whole, not a partial download) or a model name") from None
    if arch == "clip":
        raise ModelLoadError(f"FROM {given}: a vision projector (mmproj), not a model",
                         hint="FROM names the model first; the projector goes in a second FROM line")


def _projector_layer(own, given: str, base_dir: Path) -> dict[str, Any]:
    """The projector layer of a Modelfile's second FROM (a path, relative to the Modelfile's directory); the file
    is linked into the store like the model. Raises UsageError when it is missing or not a projector GGUF."""
    from ollapy.errors import UsageError
    from ollapy.store.info import read_gguf_header

    path = Path(given).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise UsageError(f"projector {given}: no such file", hint="the second FROM names the model's mmproj GGUF")
    try:
        arch = read_gguf_header(path)[0].get("general.architecture")
    except Exception:  # noqa: BLE001 - any unreadable header: not a projector
        arch = None
    if arch != "clip":
        raise UsageError(f"projector {given}: not a vision projector (mmproj) GGUF",
                         hint="the second FROM names the model's projector, e.g. mmproj-MODEL-f16.gguf")
    return _file_layer(own, path, MT_PROJECTOR)


def _file_layer(own, path: Path, media_type: str) -> dict[str, Any]:
    """A manifest layer for a local file, hard-linked into the store ``own`` as its blob where possible, else
    referenced by its absolute path (``from``). Reads the whole file once for its sha256."""
    from ollapy.store.download import link_blob

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    hexd = h.hexdigest()
    layer: dict[str, Any] = {"mediaType": media_type, "digest": f"sha256:{hexd}", "size": path.stat().st_size,
                             "filename": path.name}
    if not link_blob(own, hexd, path, symlink=False):
        layer["from"] = str(path.resolve())
    return layer


def _check_runnable(params: dict[str, Any], base: ModelRef) -> None:
    """Refuse parameters no run could use: option combinations (``draft_min`` above the draft cap: OptionError),
    a ``DRAFT`` that names no file or store model (:func:`resolve_draft`'s ModelNotFound) or one whose GGUF
    header shows another vocabulary than ``base``'s (:func:`~ollapy.store.draft_vocab.check_draft_header`'s
    DraftMismatch)."""
    from ollapy.options import Options
    from ollapy.store.draft_vocab import check_draft_header

    Options().merged(params)
    draft = str(params.get("draft", ""))
    path = resolve_draft(draft)
    if path is not None:
        check_draft_header(base.path, path, base.name, draft)


def resolve_draft(draft: str) -> Path | None:
    """The GGUF file of the draft model that a ``draft`` option or Modelfile ``DRAFT`` names (a store name, or a
    path: a relative one from the working directory), or None when it names none (``""``, ``ngram``). The one
    lookup behind ``create``'s check and every load. Never pulls. Raises ModelNotFound, its message naming the
    draft model (``draft model 'x:latest' not found``) so that it is not taken for the model asked for."""
    from ollapy.options import draft_model

    name = draft_model(draft)
    if not name:
        return None
    if looks_like_path(name) or (name.lower().endswith(".gguf") and ":" not in name):
        p = Path(name).expanduser().resolve()
        if not p.is_file():
            # a server's client is told the file's name (never the server's path) and what to do on either side
            raise ModelNotFound(f"draft model {name}: no such file", hint="check the path given to DRAFT or -o draft",
                                public=f"draft model file {p.name!r} is missing on the server (restore the file, or "
                                       "re-create the model with `ollapy create` and another DRAFT; a request can "
                                       "also set options.draft to another draft model or to \"\" for none)")
        return p
    try:
        return resolve_model(name, pull=False).path
    except ModelNotFound as e:
        def named(text: str) -> str:
            return "draft " + (text if text.startswith("model ") else f"model: {text}")

        raise ModelNotFound(named(e.message), f"pull it first: ollapy pull {name}",
                            public=named(e.public) if e.public else None, name=name) from None


def model_file_note(ref: ModelRef) -> str:
    """``linked`` / ``referenced`` / ``in store``: how the store holds the GGUF (for ``show``)."""
    p = ref.path
    if p.is_symlink():
        return f"linked to {os.path.realpath(p)}"
    return "in store" if "blobs" in p.parts else f"referenced at {p}"
