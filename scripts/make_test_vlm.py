#!/usr/bin/env python3
"""Write a small random-weight vision projector (mmproj) GGUF that libmtmd loads, for tests.

    python scripts/make_test_vlm.py OUT.gguf [--type gemma3|idefics3] [--width N] [--seed N]

No package on PyPI ships a vision GGUF pair, so the vision tests pair a synthetic projector with a text test
model. The projector checks the pipeline (tokenizing, encoding, decoding image embeddings, the cache), never the
answer's quality. Its output width is the text model's ``n_embd``:

- ``gemma3`` (the default) pairs with Gemma 3 270M (640): a one-block SigLIP-style ViT over one 32x32 image of 4x4
  patches, 2x2 average pooling, an RMS norm and ``mm.input_projection`` to 640 (16 embeddings, decoded with
  non-causal attention). Gemma 3's image wrapper is plain text, so with ``--width 576`` it pairs with SmolLM2-135M
  too: that is what the tests use (``write_projector(out, "gemma3", 0, 576)``).
- ``idefics3`` (SmolVLM's projector type; default width 576) pairs with no test model: the same ViT over 32x32
  tiles, a 2x2 pixel-shuffle and ``mm.model.fc``; libmtmd wraps its images in SmolVLM's own tokens
  (``<fake_token_around_image>``, ``<global-img>``), which SmolLM2's vocabulary lacks (libmtmd gets -1 and ollapy
  refuses the prompt). It is for a real SmolVLM text GGUF, which has them.

The keys and tensor names are the ones llama.cpp's ``tools/mtmd/clip.cpp`` loader reads (``clip.*`` metadata,
``v.blk.N.*`` tensors). Deterministic: the same type and seed give the same bytes (NumPy's PCG64 from the seed,
weights scaled to keep activations finite). Uses the official ``gguf`` writer; writes ``OUT.tmp`` then renames.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_out import gguf_file  # noqa: E402

#: output width (the text model's n_embd) per projector type
TEXT_WIDTH = {"idefics3": 576, "gemma3": 640}
IMAGE_SIZE = 32
PATCH_SIZE = 4
N_EMBD = 32
N_FF = 64
N_HEAD = 2
N_LAYER = 1
MERGE = 2


def build_tensors(kind: str, seed: int, width: int | None = None) -> dict[str, np.ndarray]:
    """Random weights of a ``kind`` projector, by GGUF tensor name (NumPy shapes are GGML's ``ne`` reversed)."""
    rng = np.random.Generator(np.random.PCG64(seed))

    def rand(*shape: int, scale: float | None = None) -> np.ndarray:
        fan_in = shape[-1] if len(shape) > 1 else 1
        s = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return (rng.standard_normal(shape) * s).astype(np.float32)

    n_patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    t: dict[str, np.ndarray] = {
        "v.patch_embd.weight": rand(N_EMBD, 3, PATCH_SIZE, PATCH_SIZE, scale=1.0 / np.sqrt(3 * PATCH_SIZE * PATCH_SIZE)),
        "v.patch_embd.bias": rand(N_EMBD, scale=0.02),
        "v.position_embd.weight": rand(n_patches, N_EMBD, scale=0.1),
        "v.post_ln.weight": np.ones(N_EMBD, np.float32),
        "v.post_ln.bias": np.zeros(N_EMBD, np.float32),
    }
    for il in range(N_LAYER):
        p = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t[f"{p}.{name}.weight"] = rand(N_EMBD, N_EMBD)
            t[f"{p}.{name}.bias"] = rand(N_EMBD, scale=0.02)
        t[f"{p}.ln1.weight"] = np.ones(N_EMBD, np.float32)
        t[f"{p}.ln1.bias"] = np.zeros(N_EMBD, np.float32)
        t[f"{p}.ln2.weight"] = np.ones(N_EMBD, np.float32)
        t[f"{p}.ln2.bias"] = np.zeros(N_EMBD, np.float32)
        t[f"{p}.ffn_up.weight"] = rand(N_FF, N_EMBD)
        t[f"{p}.ffn_up.bias"] = rand(N_FF, scale=0.02)
        t[f"{p}.ffn_down.weight"] = rand(N_EMBD, N_FF)
        t[f"{p}.ffn_down.bias"] = rand(N_EMBD, scale=0.02)
    width = width or TEXT_WIDTH[kind]
    if kind == "idefics3":
        t["mm.model.fc.weight"] = rand(width, N_EMBD * MERGE * MERGE)
    else:
        t["mm.input_projection.weight"] = rand(N_EMBD, width, scale=1.0 / np.sqrt(N_EMBD))
        t["mm.soft_emb_norm.weight"] = np.ones(N_EMBD, np.float32)
    return t


def write_projector(out: Path, kind: str, seed: int, width: int | None = None) -> Path:
    """Write a ``kind`` projector GGUF from ``seed`` to ``out`` (atomically); returns ``out``. ``width``: the
    output width (the text model's ``n_embd``; default :data:`TEXT_WIDTH` of ``kind``).

    Raises ValueError for an unknown ``kind``.
    """
    if kind not in TEXT_WIDTH:
        raise ValueError(f"unknown projector type {kind!r}: use one of {', '.join(TEXT_WIDTH)}")
    with gguf_file(out, "clip") as w:
        w.add_name(f"ollapy test projector ({kind}, seed {seed})")
        w.add_description("random weights for tests: pipeline checks only, not a real vision model")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.has_text_encoder", False)
        w.add_string("clip.projector_type", kind)
        w.add_bool("clip.use_gelu", True)
        w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
        w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
        w.add_uint32("clip.vision.embedding_length", N_EMBD)
        w.add_uint32("clip.vision.feed_forward_length", N_FF)
        w.add_uint32("clip.vision.block_count", N_LAYER)
        w.add_uint32("clip.vision.projection_dim", width or TEXT_WIDTH[kind])
        w.add_uint32("clip.vision.attention.head_count", N_HEAD)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        w.add_uint32("clip.vision.projector.scale_factor", MERGE)
        if kind == "idefics3":
            w.add_uint32("clip.vision.preproc_image_size", IMAGE_SIZE)
        for name, arr in build_tensors(kind, seed, width).items():
            w.add_tensor(name, arr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the projector GGUF to write")
    ap.add_argument("--type", dest="kind", choices=sorted(TEXT_WIDTH), default="gemma3",
                    help="projector type (gemma3 pairs with Gemma 3 270M, or SmolLM2-135M with --width 576; "
                         "idefics3 needs a SmolVLM text model)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (the same seed writes the same bytes)")
    ap.add_argument("--width", type=int, default=0, help="output width (default: the type's test model's n_embd)")
    args = ap.parse_args(argv)
    width = args.width or TEXT_WIDTH[args.kind]
    path = write_projector(args.out, args.kind, args.seed, width)
    print(f"wrote {path} ({args.kind}, {width} wide, seed {args.seed}, {path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
