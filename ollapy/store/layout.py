"""On-disk store: ``manifests/<host>/<namespace>/<model>/<tag>`` (JSON) and ``blobs/sha256-<hex>``.

The manifest format is Ollama's (Docker v2 schema with ``application/vnd.ollama.image.*``
layers) plus optional keys ollapy adds and Ollama ignores: a layer may carry
``filename`` (its original name, needed to rebuild split GGUFs) and ``from``
(an absolute path of a file the store refers to instead of holding a copy);
the manifest may carry ``ollapy: {"source": ...}``. Manifests are written to a
temporary file and renamed. Blobs are deleted only when no manifest refers to them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ollapy.errors import CorruptManifest
from ollapy.fsutil import shared_mode, write_atomically
from ollapy.store.names import ModelName

MT_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MT_CONFIG = "application/vnd.docker.container.image.v1+json"
MT_MODEL = "application/vnd.ollama.image.model"
MT_TEMPLATE = "application/vnd.ollama.image.template"
MT_SYSTEM = "application/vnd.ollama.image.system"
MT_PARAMS = "application/vnd.ollama.image.params"
MT_LICENSE = "application/vnd.ollama.image.license"
MT_MESSAGES = "application/vnd.ollama.image.messages"
MT_PROJECTOR = "application/vnd.ollama.image.projector"  # a vision model's projector (mmproj GGUF)
MT_ADAPTER = "application/vnd.ollama.image.adapter"  # a LoRA adapter GGUF (Modelfile ADAPTER), as in Ollama


def digest_hex(digest: str) -> str:
    """``sha256:<hex>`` or ``sha256-<hex>`` or ``<hex>`` → 64 lower-case hex chars; ValueError otherwise."""
    h = digest.lower().removeprefix("sha256:").removeprefix("sha256-")
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError(f"bad digest {digest!r}")
    return h


@dataclass
class Entry:
    """One manifest found in a store: its name parts, parsed JSON (or None) and why it is broken."""

    parts: tuple[str, str, str, str]
    path: Path
    manifest: dict[str, Any] | None
    broken: str | None
    modified: float

    def model_layers(self) -> list[dict[str, Any]]:
        """The GGUF layers in order (more than one for a split GGUF)."""
        return [layer for layer in (self.manifest or {}).get("layers", []) if layer.get("mediaType") == MT_MODEL]

    def display(self) -> str:
        """Ollama-style name of the entry."""
        host, ns, model, tag = self.parts
        plain = ModelName(host, ns, model, tag).display()
        named = ((self.manifest or {}).get("ollapy") or {}).get("name")
        return named if isinstance(named, str) and named.lower() == plain.lower() else plain


class Store:
    """A model store rooted at ``root``; ``read_only`` stores (an Ollama store) are never written."""

    def __init__(self, root: Path, read_only: bool = False) -> None:
        self.root = Path(root)
        self.read_only = read_only

    @property
    def blobs(self) -> Path:
        """The blob directory."""
        return self.root / "blobs"

    @property
    def manifests(self) -> Path:
        """The manifest directory."""
        return self.root / "manifests"

    def blob_path(self, digest: str) -> Path:
        """Path of the complete blob for ``digest``."""
        return self.blobs / f"sha256-{digest_hex(digest)}"

    def partial_path(self, digest: str) -> Path:
        """Path where a blob is downloaded before its digest is checked."""
        return self.blobs / f"sha256-{digest_hex(digest)}-partial"

    def manifest_path(self, name: ModelName) -> Path:
        """Path of the manifest for a (validated) name."""
        return self.manifests.joinpath(*name.parts())

    def has_blob(self, digest: str, size: int | None = None) -> bool:
        """True when the blob exists (following links) with the given size, if any."""
        p = self.blob_path(digest)
        try:
            return p.is_file() and (size is None or p.stat().st_size == size)
        except OSError:
            return False

    def layer_file(self, layer: dict[str, Any]) -> Path:
        """The file holding a layer's bytes: the blob, or the referenced ``from`` path."""
        blob = self.blob_path(layer["digest"])
        if layer.get("from") and not os.path.lexists(blob):
            return Path(layer["from"])
        return blob

    def read_entry(self, path: Path) -> Entry:
        """Read one manifest file; a broken one is returned with ``broken`` set (never raises on content)."""
        parts = tuple(path.relative_to(self.manifests).parts)
        mtime = path.stat().st_mtime
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return Entry(parts, path, None, f"unreadable manifest: {str(exc).splitlines()[0][:80]}", mtime)
        reason = self.check_manifest(data)
        return Entry(parts, path, data if reason is None else None, reason, mtime)

    def check_manifest(self, data: Any) -> str | None:
        """Return why a parsed manifest is unusable (shape, missing model layer, missing blob), or None."""
        if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
            return "manifest has no layers list"
        models = 0
        for layer in data["layers"]:
            if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str):
                return "manifest has a layer without a digest"
            try:
                digest_hex(layer["digest"])
            except ValueError:
                return f"bad digest {str(layer['digest'])[:30]!r}"
            if layer.get("mediaType") == MT_MODEL:
                models += 1
            if not self.layer_file(layer).is_file():
                return f"missing blob {layer['digest'][:19]}"
        return None if models else "manifest has no model layer"

    def find(self, name: ModelName) -> Entry | None:
        """The entry for ``name``, or None when no manifest exists."""
        p = self.manifest_path(name)
        return self.read_entry(p) if p.is_file() else None

    def entries(self) -> Iterator[Entry]:
        """Every manifest under ``manifests/`` (depth host/namespace/model/tag), sorted by path."""
        if not self.manifests.is_dir():
            return
        for p in sorted(self.manifests.glob("*/*/*/*")):
            if p.is_file() and not p.name.startswith("."):
                yield self.read_entry(p)

    def write_manifest(self, name: ModelName, manifest: dict[str, Any]) -> Path:
        """Write ``manifest`` for ``name`` atomically (temp file + rename); return its path."""
        self._writable()
        manifest = dict(manifest, ollapy=dict(manifest.get("ollapy") or {}, name=name.display()))
        target = self.manifest_path(name)
        body = json.dumps(manifest, indent=2).encode("utf-8")
        write_atomically(target, lambda f: f.write(body), suffix=".json", mode=shared_mode(), fsync=True)
        return target

    def write_blob_bytes(self, data: bytes) -> dict[str, Any]:
        """Store small bytes (template, params...) as a blob; return ``{digest, size}``."""
        import hashlib

        self._writable()
        h = hashlib.sha256(data).hexdigest()
        p = self.blob_path(h)
        if not p.is_file():
            write_atomically(p, lambda f: f.write(data), mode=shared_mode())
        return {"digest": f"sha256:{h}", "size": len(data)}

    def referenced_digests(self, skip: Path | None = None) -> set[str]:
        """Hex digests referred to by any readable manifest other than ``skip``."""
        out: set[str] = set()
        for e in self.entries():
            if skip is not None and e.path == skip:
                continue
            try:
                data = json.loads(e.path.read_text(encoding="utf-8"))
                layers = list(data.get("layers", [])) + ([data["config"]] if isinstance(data.get("config"), dict) else [])
                for layer in layers:
                    out.add(digest_hex(layer["digest"]))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
        return out

    def remove(self, entry: Entry) -> list[Path]:
        """Delete a manifest and the blobs only it referred to; return the deleted blob paths."""
        self._writable()
        mine: set[str] = set()
        try:
            data = json.loads(entry.path.read_text(encoding="utf-8"))
            for layer in list(data.get("layers", [])) + [data.get("config") or {}]:
                try:
                    mine.add(digest_hex(layer["digest"]))
                except (KeyError, ValueError, TypeError):
                    pass
        except (OSError, ValueError, AttributeError):
            pass
        entry.path.unlink()
        for d in (entry.path.parent, entry.path.parent.parent, entry.path.parent.parent.parent):
            try:
                d.rmdir()
            except OSError:
                break
        removed = []
        for h in sorted(mine - self.referenced_digests()):
            p = self.blob_path(h)
            if os.path.lexists(p):
                p.unlink()
                removed.append(p)
            links = self.root / "links" / f"sha256-{h}"
            if links.is_dir():
                for f in links.iterdir():
                    f.unlink()
                links.rmdir()
        return removed

    def split_path(self, layers: list[dict[str, Any]]) -> Path:
        """For a split GGUF: a directory of links named as the original parts; return the first part's path."""
        first = digest_hex(layers[0]["digest"])
        d = self.root / "links" / f"sha256-{first}"
        d.mkdir(parents=True, exist_ok=True)
        out = None
        for layer in layers:
            link = d / Path(layer.get("filename") or f"part-{digest_hex(layer['digest'])}.gguf").name
            target = self.layer_file(layer).resolve()
            if not (link.is_symlink() and os.readlink(link) == str(target)):
                link.unlink(missing_ok=True)
                os.symlink(target, link)
            out = out or link
        assert out is not None
        return out

    def _writable(self) -> None:
        if self.read_only:
            raise CorruptManifest(f"{self.root} is a read-only store", hint="models from an Ollama store cannot be changed here")
