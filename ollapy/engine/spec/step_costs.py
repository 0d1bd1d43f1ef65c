"""Step times the draft policy measured, remembered per model and machine across processes.

Why. The draft policy (:class:`ollapy.engine.spec.policy.StepCost`) prices a verification by the median step time
measured for each batch size. A new process (every ``ollapy run``) would start from the prior and spend its first
steps finding out what 2, 3 or 4 rows cost, drafting less well meanwhile (docs/benchmarks.md). So the engine
writes its measured steps when the model is unloaded and the next process that loads the same model the same way
starts from them; its own steps replace
them as they come (the policy keeps the last 16 per batch size).

Where: ``step-costs/KEY.json`` beside the prompt cache's root (``config.step_costs_dir``). KEY hashes what a step's
time depends on: the model file (path, size, mtime), the draft model's, threads, slots, context length, GPU
offload, flash attention, and the llama.cpp build (version and patches). A missing, unreadable or foreign file is
ignored (no seed), a failed write is logged and dropped: the store only ever saves a few steps of exploration.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ollapy.fsutil import write_atomically

log = logging.getLogger("ollapy.engine")

FORMAT = 1
#: at most this many samples per batch size are stored (the policy keeps 16)
KEEP = 16


def file_identity(path: str | os.PathLike) -> str:
    """``path`` resolved, with its size and mtime (another file at the same path is another identity); the path
    alone when it cannot be stat'ed."""
    p = Path(path)
    try:
        st = p.resolve().stat()
    except OSError:
        return str(p)
    return f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def step_cost_key(model: str | os.PathLike, facts: Mapping[str, object]) -> str:
    """A file-name-safe key for ``model``'s step times under ``facts`` (what else a step's time depends on:
    threads, slots, build...), the model file's :func:`file_identity` included."""
    blob = json.dumps({"model": file_identity(model), **{k: str(v) for k, v in facts.items()}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class StepCostStore:
    """Reads and writes measured ``(rows, seconds)`` decode steps under ``root``, one JSON file per key."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        assert key.isalnum(), key
        return self.root / f"{key}.json"

    def load(self, key: str) -> list[tuple[int, float]]:
        """The stored steps for ``key``; [] when there are none or the file is not a store file."""
        try:
            data = json.loads(self._path(key).read_text())
            if data.get("format") != FORMAT:
                return []
            return [(int(r), float(s)) for r, s in data["steps"] if int(r) >= 1 and float(s) > 0]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def save(self, key: str, steps: Iterable[tuple[int, float]]) -> None:
        """Store ``steps`` (the last :data:`KEEP` per batch size) for ``key``; logs and returns on an OS error."""
        by_rows: dict[int, list[float]] = {}
        for r, s in steps:
            by_rows.setdefault(int(r), []).append(float(s))
        kept = [[r, s] for r, v in sorted(by_rows.items()) for s in v[-KEEP:]]
        if not kept:
            return
        body = json.dumps({"format": FORMAT, "steps": kept}).encode()
        try:
            write_atomically(self._path(key), lambda f: f.write(body))
        except OSError as e:
            log.warning("could not save the draft policy's step times: %s", e)
