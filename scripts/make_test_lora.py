#!/usr/bin/env python3
"""Write a small deterministic LoRA adapter GGUF for a test model, for tests of ``ADAPTER``.

    python scripts/make_test_lora.py OUT.gguf --base MODEL.gguf [--seed N] [--rank R] [--alpha A] [--strength S]

No package on PyPI ships a LoRA adapter for the test models, so the adapter tests pair a synthetic one with a
real base model (SmolLM2-135M or Gemma 3 270M). It checks the pipeline (loading through llama.cpp's adapter API,
applying it at a scale, the prompt cache keeping adapter and base apart), never an answer's quality.

The layout is the one llama.cpp's ``llama_adapter_lora_init`` reads (``src/llama-adapter.cpp``):

- keys ``general.type = "adapter"``, ``general.architecture`` = the base model's (llama.cpp refuses a
  mismatch), ``adapter.type = "lora"``, ``adapter.lora.alpha``;
- for each adapted weight ``W`` of GGML shape ``ne = [n_in, n_out]``, a pair ``W.lora_a`` with ``ne = [n_in, r]``
  and ``W.lora_b`` with ``ne = [r, n_out]`` (NumPy shapes are GGML's reversed), F32. llama.cpp adds
  ``scale * alpha / r * (B @ A) x`` to ``W x`` (``llama-graph.cpp``, ``build_lora_mm``).

Adapted weights: every block's ``attn_q`` and ``attn_v`` (the targets most LoRA fine-tunes start with). Weights
are NumPy PCG64 normals from ``--seed``: ``A`` scaled by ``1/sqrt(n_in)``, ``B`` by ``--strength``, so the same
arguments give the same bytes, and the default strength moves a greedy answer of the test models. Uses the
official ``gguf`` writer; writes ``OUT.tmp`` and renames it into place. Exit 1 with one line on a bad base file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_out import gguf_file  # noqa: E402

TARGETS = ("attn_q.weight", "attn_v.weight")


def base_shapes(base: Path) -> tuple[str, dict[str, tuple[int, int]]]:
    """The base GGUF's architecture and the GGML ``(n_in, n_out)`` of each weight an adapter targets.

    Raises ValueError when the file is not a GGUF model or has no such weights."""
    from gguf import GGUFReader

    reader = GGUFReader(str(base))
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{base}: no general.architecture (not a GGUF model)")
    arch = bytes(field.parts[field.data[0]]).decode()
    shapes = {}
    for t in reader.tensors:
        if t.name.endswith(TARGETS) and t.name.startswith("blk."):
            ne = [int(x) for x in t.shape]  # GGML order: ne[0] is the input width
            shapes[t.name] = (ne[0], ne[1])
    if not shapes:
        raise ValueError(f"{base}: no {' or '.join(TARGETS)} tensors to adapt")
    return arch, shapes


def build_tensors(shapes: dict[str, tuple[int, int]], seed: int, rank: int, strength: float) -> dict[str, np.ndarray]:
    """The ``.lora_a`` / ``.lora_b`` arrays by GGUF tensor name, NumPy shapes ``(r, n_in)`` and ``(n_out, r)``."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out: dict[str, np.ndarray] = {}
    for name in sorted(shapes):
        n_in, n_out = shapes[name]
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
        b = rng.standard_normal((n_out, rank)) * strength
        out[f"{name}.lora_a"] = a.astype(np.float32)
        out[f"{name}.lora_b"] = b.astype(np.float32)
    return out


def make_test_lora(out: Path, base: Path, seed: int = 0, rank: int = 8, alpha: float | None = None,
                   strength: float = 0.3) -> Path:
    """Write the adapter for ``base`` to ``out`` (atomically) and return ``out``. ``alpha`` defaults to ``rank``
    (an effective scale of 1). Raises ValueError for a base llama.cpp could not pair it with."""
    arch, shapes = base_shapes(base)
    tensors = build_tensors(shapes, seed, rank, strength)
    with gguf_file(out, arch) as w:
        w.add_type("adapter")
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", float(rank if alpha is None else alpha))
        w.add_name(f"ollapy test LoRA for {base.name} (seed {seed}, rank {rank})")
        for name, arr in tensors.items():
            w.add_tensor(name, arr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--base", type=Path, required=True, help="the base model GGUF the adapter is for")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=None, help="adapter.lora.alpha (default: the rank)")
    ap.add_argument("--strength", type=float, default=0.3, help="standard deviation of the B matrices")
    args = ap.parse_args(argv)
    try:
        make_test_lora(args.out, args.base, args.seed, args.rank, args.alpha, args.strength)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
