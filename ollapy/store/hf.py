"""Hugging Face source through huggingface_hub (its cache, resume, ``HF_TOKEN``, ``HF_ENDPOINT``).

``hf.co/org/repo[:QUANT|:file.gguf]``: the tag is matched against the repo's
GGUF files (``latest`` picks the first present of :data:`QUANT_PREFERENCE`),
every part of a split GGUF (``*-00001-of-0000N.gguf``) is fetched, and the
store links each blob to the file in the HF cache instead of copying it. The
sha256 of each file is checked against the repo's LFS oid.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from ollapy.errors import DownloadError, ModelNotFound
from ollapy.store.download import NotAtSource, link_blob
from ollapy.store.layout import MT_MODEL, MT_PROJECTOR, Store
from ollapy.store.names import ModelName
from ollapy.store.progress import QuietProgress

QUANT_PREFERENCE = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q5_0", "Q6_K", "Q8_0", "IQ4_XS", "Q3_K_M", "BF16", "F16")
"""Quantizations tried, in order, for the ``latest`` tag."""

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _hub_base() -> str:
    """The Hub's base URL: ``HF_ENDPOINT`` or huggingface.co, without a trailing slash."""
    return (_endpoint() or "https://huggingface.co").rstrip("/")


def _hf_errors():
    from huggingface_hub import errors

    return errors


def list_gguf(repo_id: str, revision: str | None = None, *,
              projectors: bool = False) -> dict[str, tuple[int | None, str | None]]:
    """Map each ``.gguf`` path in the repo to (size, lfs sha256): the models, or with ``projectors`` the vision
    projectors (``mmproj`` in the name) only. Raises NotAtSource / DownloadError."""
    from huggingface_hub import HfApi

    errors = _hf_errors()
    try:
        items = list(HfApi(endpoint=_endpoint()).list_repo_tree(repo_id, recursive=True, revision=revision))
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.GatedRepoError) as exc:
        raise NotAtSource(f"Hugging Face repo {repo_id} not found or not accessible ({type(exc).__name__})",
                          hint="check the repo name; set HF_TOKEN for gated or private repos") from None
    except Exception as exc:  # noqa: BLE001 - network errors come in several library types
        if getattr(getattr(exc, "response", None), "status_code", None) == 404:
            raise NotAtSource(f"Hugging Face repo {repo_id} not found", hint="check the repo name") from None
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise DownloadError(f"cannot list Hugging Face repo {repo_id}: {why}",
                            hint="check the network, HF_ENDPOINT and HF_TOKEN") from None
    out: dict[str, tuple[int | None, str | None]] = {}
    for it in items:
        path = getattr(it, "path", "")
        if path.lower().endswith(".gguf") and ("mmproj" in path.lower()) == projectors:
            lfs = getattr(it, "lfs", None)
            out[path] = (getattr(it, "size", None), getattr(lfs, "sha256", None) if lfs else None)
    return out


def select_files(files: list[str], tag: str) -> list[str]:
    """Pick the file(s) for ``tag`` (a quant like ``Q4_K_M``, a file name, or ``latest``); all parts of a split.

    Raises ModelNotFound listing the quantizations the repo has.
    """
    if tag.lower().endswith(".gguf"):
        chosen = [f for f in files if f.lower() == tag.lower() or f.rsplit("/", 1)[-1].lower() == tag.lower()]
    else:
        wanted = QUANT_PREFERENCE if tag.lower() == "latest" else (tag,)
        chosen = []
        for q in wanted:
            rx = re.compile(rf"(^|[^A-Za-z0-9]){re.escape(q)}([^A-Za-z0-9]|$)", re.IGNORECASE)
            chosen = [f for f in files if rx.search(f.rsplit("/", 1)[-1])]
            if chosen:
                break
        if not chosen and tag.lower() == "latest" and files:
            chosen = [min(files)]
    if not chosen:
        quants = sorted({q for f in files for q in QUANT_PREFERENCE if q.lower() in f.lower()})
        raise ModelNotFound(f"no GGUF file for tag {tag!r}",
                            hint="available: " + (", ".join(quants or files[:8]) or "no .gguf files"))
    first = min(chosen)
    m = _SPLIT.search(first)
    if not m:
        return [first]
    prefix = first[: m.start()]
    return sorted(f for f in files if f.startswith(prefix) and _SPLIT.search(f))


#: a projector's precision, most preferred first, when none matches the model's quantization (llama.cpp -hf's rule)
PROJECTOR_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")


def select_projector(files: list[str], model_file: str) -> str | None:
    """The ``mmproj`` file to pull with ``model_file``: one of the model's quantization, else F16, BF16, F32,
    Q8_0, else the first by name; None when the repo has none."""
    if not files:
        return None
    name = model_file.rsplit("/", 1)[-1].lower()
    for q in [q for q in QUANT_PREFERENCE if q.lower() in name] + list(PROJECTOR_PREFERENCE):
        rx = re.compile(rf"(^|[^A-Za-z0-9]){re.escape(q)}([^A-Za-z0-9]|$)", re.IGNORECASE)
        found = sorted(f for f in files if rx.search(f.rsplit("/", 1)[-1]))
        if found:
            return found[0]
    return min(files)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch_hf_files(store: Store, repo_id: str, files: list[str], meta: dict[str, tuple[int | None, str | None]],
                   progress: QuietProgress, quiet: bool, revision: str | None = None,
                   expect_sha256: str | None = None, media_type: str = MT_MODEL) -> list[dict[str, Any]]:
    """Download ``files`` through huggingface_hub and link blobs to its cache; return their layers (of
    ``media_type``: model, or a vision projector).

    Raises DownloadError on a network failure or a sha256 mismatch (LFS oid or ``expect_sha256``).
    """
    import sys

    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    if quiet or not sys.stderr.isatty():
        disable_progress_bars()
    else:
        enable_progress_bars()
    layers = []
    for fname in files:
        size, oid = meta.get(fname, (None, None))
        progress.stage(f"pulling hf.co/{repo_id}/{fname} through huggingface_hub")
        try:
            local = Path(hf_hub_download(repo_id, fname, revision=revision, endpoint=_endpoint()))
        except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many types
            why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            raise DownloadError(f"download of {fname} from Hugging Face failed: {why}",
                                hint="pull again to resume; check HF_ENDPOINT / HF_TOKEN") from None
        real = local.resolve()
        want = expect_sha256 if (expect_sha256 and len(files) == 1) else oid
        digest = _sha256(real)
        if want and digest != want.lower():
            raise DownloadError(f"{fname}: sha256 mismatch (got {digest[:12]}, expected {want[:12]})",
                                hint="delete the file from the Hugging Face cache and pull again")
        if size is not None and real.stat().st_size != size:
            raise DownloadError(f"{fname}: size mismatch ({real.stat().st_size} != {size})")
        layer: dict[str, Any] = {"mediaType": media_type, "digest": f"sha256:{digest}", "size": real.stat().st_size,
                                 "filename": fname.rsplit("/", 1)[-1]}
        if not link_blob(store, digest, real, symlink=True):
            layer["from"] = str(real)
        layers.append(layer)
    return layers


def pull_hf(store: Store, name: ModelName, progress: QuietProgress, quiet: bool = False) -> dict[str, Any]:
    """Pull ``hf.co/org/repo:tag`` into the store, with the repo's vision projector (:func:`select_projector`)
    as a projector layer when it has one; returns the written manifest.

    Raises DownloadError at once when the Hub does not answer (one probe, instead of
    huggingface_hub's ~20 s of retries), ModelNotFound for a missing repo, file or quant.
    """
    if not hf_reachable(name.repo_id):
        raise DownloadError(f"cannot pull {name.display()}: Hugging Face ({_hub_base()}) is unreachable from here",
                            hint="check the network, or set HF_ENDPOINT to a reachable mirror")
    try:
        meta = list_gguf(name.repo_id)
    except NotAtSource as exc:
        raise ModelNotFound(exc.message, hint="check the repo name; set HF_TOKEN for gated or private repos") from None
    if not meta:
        raise ModelNotFound(f"Hugging Face repo {name.repo_id} has no .gguf files",
                            hint="pick a GGUF repo, e.g. one ending in -GGUF")
    files = select_files(list(meta), name.tag)
    layers = fetch_hf_files(store, name.repo_id, files, meta, progress, quiet)
    projectors = list_gguf(name.repo_id, projectors=True)  # a vision model's mmproj comes along (llama-server -hf)
    proj = select_projector(list(projectors), files[0])
    if proj is not None:
        layers += fetch_hf_files(store, name.repo_id, [proj], projectors, progress, quiet, media_type=MT_PROJECTOR)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "layers": layers, "ollapy": {"source": f"hf.co/{name.repo_id}/{files[0]}"}}
    store.write_manifest(name, manifest)
    return manifest


_REACH: dict[str, bool] = {}


def hf_reachable(repo_id: str, timeout: float = 5.0) -> bool:
    """One quick request to the Hub (``HF_ENDPOINT``); False on a network error, so callers can skip it fast.

    huggingface_hub itself retries unreachable hosts for ~20 s; this probe fails in one try.
    """
    import httpx

    base = _hub_base()
    if base not in _REACH:
        try:
            httpx.head(f"{base}/api/models/{repo_id}", timeout=timeout)
            _REACH[base] = True
        except httpx.TransportError:
            _REACH[base] = False
    return _REACH[base]
