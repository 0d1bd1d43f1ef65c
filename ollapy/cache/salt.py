"""What makes a saved KV state valid: the model file's sha256 and the KV settings.

The model sha256 is computed at most once per file version: it is memoized on
disk under ``<cache root>/digests/`` keyed by (path, size, mtime_ns), so a new
``ollapy run`` process pays a ``stat`` instead of hashing hundreds of MB.
The KV salt lists every setting that changes the bytes of a sequence state, and what computed them (devices,
offload, repacked weights, row invariance): a state restored where another's kernels would have computed the
cells could change a greedy answer.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

HASH_CHUNK = 1 << 22


def normalize_digest(digest: str | None) -> str | None:
    """``sha256:<hex>`` / ``sha256-<hex>`` / ``<hex>`` -> lowercase hex, or None when not a sha256."""
    if not digest:
        return None
    d = digest.strip().lower()
    for prefix in ("sha256:", "sha256-"):
        d = d.removeprefix(prefix)
    if len(d) == 64 and all(c in "0123456789abcdef" for c in d):
        return d
    return None


def _memo_path(root: Path, path: Path) -> Path:
    key = hashlib.blake2b(str(path).encode("utf-8", "surrogateescape"), digest_size=12).hexdigest()
    return root / "digests" / f"{key}.json"


def memoized_sha256(path: str | Path, root: Path) -> str | None:
    """The memoized sha256 of a file (a ``stat`` and a small read), or None when it must be computed."""
    try:
        p = Path(path).resolve()
        st = p.stat()
        data = json.loads(_memo_path(root, p).read_text())
        if data.get("path") == str(p) and data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns:
            return normalize_digest(data.get("sha256"))
    except (OSError, ValueError, AttributeError):
        pass
    return None


def file_sha256(path: str | Path, root: Path | None = None) -> str:
    """sha256 hex of a file, memoized under ``root/digests`` by (resolved path, size, mtime_ns)."""
    p = Path(path).resolve()
    st = p.stat()
    memo = _memo_path(root, p) if root is not None else None
    if root is not None:
        d = memoized_sha256(p, root)
        if d:
            return d
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            chunk = f.read(HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=memo.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump({"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}, f)
            os.replace(tmp, memo)
        except OSError:
            pass
    return digest


def kv_salt(kv_cache_type: str, flash_attn: str, library_version: str, state_layout: str = "seq-portable-1",
            parts: tuple[tuple[str, object], ...] = ()) -> dict:
    """The settings that change a sequence state's bytes, as a JSON-able dict.

    ``flash_attn`` is the effective choice (quantized KV types force it on);
    the llama-cpp-python version stands in for llama.cpp's state format;
    ``state_layout`` is the backend's: slot-count independent
    (``seq-portable-1``) or ``streams-N`` (llama.cpp refuses a state saved
    with another number of KV streams). ``parts``: more identity, as
    ``(name, JSON-able value)`` pairs added under their names (the backend's
    ``compute`` identity: devices, offload, repacked weights, row invariance;
    and the LoRA adapters applied). Raises ValueError for a part whose
    name is taken.
    """
    fa = flash_attn
    if kv_cache_type != "f16" and flash_attn == "auto":
        fa = "on"
    salt = {
        "type_k": kv_cache_type,
        "type_v": kv_cache_type,
        "flash_attn": fa,
        "kv_unified": False,
        "swa_full": True,
        "state_format": f"llama-cpp-python {library_version}",
        "state_layout": state_layout,
    }
    for name, value in parts:
        if name in salt:
            raise ValueError(f"salt part {name!r} is taken")
        salt[name] = value
    return salt


def salt_key(salt: dict) -> str:
    """Short stable hex key of a salt dict (used in directory names)."""
    return hashlib.blake2b(json.dumps(salt, sort_keys=True).encode(), digest_size=6).hexdigest()


def salt_from_backend(backend) -> dict:
    """The KV salt of a loaded :class:`ollapy.engine.backend.context.Backend`: its KV settings plus its
    ``compute_identity`` (what computes the cells: devices and offload, RPC layout, ``tensor_split``, repacked
    weights, row invariance; issue 53) where it has one, and its LoRA adapters.

    A model with LoRA adapters computes other KV than its base model from the same tokens, so each adapter's
    identity (its file's sha256) and scale join the salt, in the order they are applied: a base model's state
    never serves the adapted model, nor one adapter's another's."""
    cfg = backend.cfg
    parts: list[tuple[str, object]] = []
    compute = getattr(backend, "compute_identity", None)
    if compute is not None:
        parts.append(("compute", compute))
    adapters = getattr(cfg, "adapters", ())
    if adapters:
        parts.append(("adapters", [[adapter_identity(a.path), a.scale] for a in adapters]))
    return kv_salt(cfg.kv_cache_type, getattr(backend, "flash_attn", cfg.flash_attn), library_version(),
                   getattr(backend, "state_layout", "seq-portable-1"), parts=tuple(parts))


def adapter_identity(path: str | Path) -> str:
    """A LoRA adapter file's sha256: from a store blob's name (``sha256-<hex>``) when it is one, else hashed."""
    p = Path(path)
    named = normalize_digest(p.name) if p.name.startswith("sha256-") else None
    return named or file_sha256(p)


def library_version() -> str:
    """Installed llama-cpp-python version, read from package metadata (does not import llama_cpp)."""
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - metadata missing in odd installs
        return "unknown"
