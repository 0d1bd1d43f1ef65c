"""Memory-aware admission of model loads: how much a load needs, how much there is, and which idle model goes.

Follows Ollama's scheduler (``server/sched.go``): before a load, estimate its size; when it does not fit in the
memory available now, unload an idle loaded model (ollapy: least recently used first; Ollama: shortest
keep_alive first) and measure again; a load with nothing else loaded goes ahead whatever the estimate (llama.cpp
then reports what it cannot allocate). Where Ollama waits for a busy model to finish, ollapy answers 503 with
``Retry-After`` (:class:`~ollapy.errors.BusyError`).

* :func:`estimate_load`: weights (the GGUF file's bytes: llama.cpp maps them) plus the KV cache
  (``n_layer * n_head_kv * (key_length + value_length) * bytes(kv type)`` per token, times ``num_ctx *
  num_parallel``), from the GGUF header alone.
* :func:`available_memory`: ``MemAvailable`` of ``/proc/meminfo``, capped by the cgroup v2 ``memory.max``
  minus ``memory.current`` (a container's limit); ``OLLAPY_MAX_MEMORY`` replaces it with a fixed budget minus
  what the loaded models take.
* :func:`choose_evictions`: the pure decision, tested without models.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
KV_BYTES = {"f16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32}  # bytes per element (ggml block sizes)


@dataclass(frozen=True)
class LoadEstimate:
    """Bytes a load needs: ``weights`` (the model file) and ``kv`` (the KV cache of every slot)."""

    weights: int
    kv: int

    @property
    def total(self) -> int:
        """Weights plus KV cache, in bytes."""
        return self.weights + self.kv


def kv_bytes_per_token(meta: dict, kv_cache_type: str = "f16") -> int:
    """KV-cache bytes per token of a model from its GGUF metadata (``{arch}.block_count``,
    ``{arch}.attention.head_count_kv`` (else ``head_count``), ``key_length``/``value_length`` (else
    ``embedding_length / head_count``)); 0 when the header lacks them. A per-layer array of head counts
    (summarised by the header reader) counts as ``head_count`` for every layer: an over-estimate."""
    arch = meta.get("general.architecture") or ""

    def num(key: str) -> int:
        v = meta.get(f"{arch}.{key}")
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0

    layers, heads, embd = num("block_count"), num("attention.head_count"), num("embedding_length")
    kv_heads = num("attention.head_count_kv") or heads
    head_dim = embd // heads if heads else 0
    k = num("attention.key_length") or head_dim
    v = num("attention.value_length") or head_dim
    return int(layers * kv_heads * (k + v) * KV_BYTES.get(kv_cache_type, 2.0))


def estimate_load(path: str | os.PathLike, num_ctx: int, num_parallel: int, kv_cache_type: str = "f16") -> LoadEstimate:
    """What loading the GGUF at ``path`` with these options takes; reads the header only (milliseconds).
    Raises ModelLoadError for a file that is not GGUF."""
    from ollapy.store.info import read_gguf_header

    meta, _ = read_gguf_header(Path(path))
    per_token = kv_bytes_per_token(meta, kv_cache_type)
    return LoadEstimate(weights=os.path.getsize(path), kv=per_token * max(1, num_ctx) * max(1, num_parallel))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory(proc: Path = PROC, cgroup: Path = CGROUP) -> int | None:
    """Bytes this process could still take: ``MemAvailable`` (``/proc/meminfo``), capped by the cgroup v2
    limit left (``memory.max - memory.current`` of the process's cgroup); None where neither can be read."""
    avail = None
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        rel = next((ln.split(":", 2)[2] for ln in (proc / "self" / "cgroup").read_text().splitlines()
                    if ln.startswith("0::")), None)
    except OSError:
        rel = None
    if rel is not None:
        d = cgroup / rel.lstrip("/")
        limit, current = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        if limit is not None and current is not None:
            left = max(0, limit - current)
            avail = left if avail is None else min(avail, left)
    return avail


@dataclass(frozen=True)
class Resident:
    """A loaded model as admission sees it: its key, bytes held, whether a request uses it, last use."""

    key: str
    size: int
    busy: bool
    last_used: float


def choose_evictions(need: int, residents: Sequence[Resident], *, budget: int | None, available: int | None,
                     max_models: int) -> tuple[list[str], bool]:
    """Which idle models to unload so a load of ``need`` bytes fits; returns ``(keys in unload order, fits)``.

    Room means both: fewer than ``max_models`` loaded, and memory. Memory is ``budget`` (``OLLAPY_MAX_MEMORY``)
    minus what the residents hold, or else ``available`` now (what the unloaded models free comes back to it).
    Idle residents go least recently used first, only as many as needed. ``fits`` False: even unloading every
    idle model leaves no room (busy models hold it); with no resident at all a load always fits (as Ollama,
    llama.cpp then reports what it cannot allocate). Unknown memory (both None) constrains nothing.
    """
    if not residents:
        return [], True
    held = sum(r.size for r in residents)
    free = (budget - held) if budget is not None else available
    count = len(residents)
    out: list[str] = []
    for r in sorted((r for r in residents if not r.busy), key=lambda r: r.last_used):
        if count < max_models and (free is None or need <= free):
            break
        out.append(r.key)
        count -= 1
        if free is not None:
            free += r.size
    fits = count < max_models and (free is None or need <= free or count == 0)
    return out, fits
