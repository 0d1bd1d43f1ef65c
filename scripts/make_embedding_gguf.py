"""Make an embedding model from a generative GGUF: a copy with ``{arch}.pooling_type`` added to its metadata.

Ollama and llm-ollama treat a GGUF that declares a pooling type as an embedding model (``/api/show`` lists the
``embedding`` capability, and only such models are offered for embeddings by some clients). No embedding GGUF is
reachable on a machine without Hugging Face, so the tests and ``scripts/check_clients.sh`` make one from SmolLM2:
the same weights, with pooling LAST (3), as decoder embedding models such as Qwen3-Embedding declare it. Its vectors
equal the generative model's own ``/api/embed`` vectors (LAST is what a decoder without a pooling type gets).

Usage: ``python scripts/make_embedding_gguf.py SRC.gguf DST.gguf [--pooling 3]``. Deterministic: the same input
gives the same bytes.
"""
from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POOLING_LAST = 3  # llama.cpp's LLAMA_POOLING_TYPE_LAST


def with_pooling_type(src: Path, dst: Path, pooling: int = POOLING_LAST) -> Path:
    """Write to ``dst`` a copy of the GGUF ``src`` with ``{arch}.pooling_type`` (uint32 ``pooling``) appended to its
    metadata; the tensor data is copied as is, re-aligned to ``general.alignment``. Returns ``dst``.

    Raises OSError when a file cannot be read or written; ValueError for a file that is not a GGUF."""
    from ollapy.store import info as gi

    with open(src, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{src} is not a GGUF file")
        version = gi._read(f, "<I")
        n_tensors, n_kv = gi._read(f, "<Q"), gi._read(f, "<Q")
        kv_start = f.tell()
        arch, align = "llama", 32
        for _ in range(n_kv):
            key = gi._string(f)
            val = gi._value(f, gi._read(f, "<I"))
            arch = val if key == "general.architecture" else arch
            align = int(val) if key == "general.alignment" else align
        kv_end = f.tell()
        for _ in range(n_tensors):
            gi._string(f)
            f.seek(8 * gi._read(f, "<I") + 12, 1)
        infos_end = f.tell()
        f.seek(0)
        data = f.read()
    key = f"{arch}.pooling_type".encode()
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, pooling)
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + data[kv_start:kv_end] + kv + data[kv_end:infos_end]
    old_data = -(-infos_end // align) * align
    with open(dst, "wb") as out:
        out.write(head + b"\0" * (-len(head) % align))
        out.write(data[old_data:])
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--pooling", type=int, default=POOLING_LAST, help="llama.cpp pooling type (1 mean, 2 cls, 3 last)")
    args = ap.parse_args()
    print(with_pooling_type(args.src, args.dst, args.pooling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
