#!/usr/bin/env python3
"""Cut a GGUF model down to its first K transformer blocks: a shallow draft model with the SAME vocabulary.

    python scripts/make_draft_gguf.py SRC.gguf DST.gguf --layers 4

No second SmolLM2 (or Gemma 3) ships in a package here, and speculative decoding with a draft model needs
one whose tokenizer matches the target's. Keeping the token embeddings (``token_embd``), the final norm
(``output_norm``), the output layer (``output``, when the model does not tie it to the embeddings) and
blocks ``0..K-1`` gives a model that llama.cpp loads as the same architecture: every ``blk.N.*`` tensor with
N >= K is dropped, ``{arch}.block_count`` becomes K, per-layer metadata arrays (values with one entry per
block) are cut to K entries, and ``general.name`` says what it is. The tokenizer metadata is copied
unchanged. Its predictions are poor, which is fine for plumbing tests (and a test of acceptance falling).

Deterministic: the same input and K give the same bytes (metadata and tensors in the source's order, no
timestamps). Written to ``DST.tmp`` and renamed. Uses the official ``gguf`` library (reader and writer).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

KEEP = ("token_embd.", "output_norm.", "output.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def make_draft_gguf(src: Path, dst: Path, n_layers: int) -> Path:
    """Write the first ``n_layers`` blocks of ``src`` (plus embeddings, final norm, output) to ``dst``.

    Raises ValueError when ``n_layers`` is not in ``[1, block_count]`` or ``src`` has no block count.
    Returns ``dst``.
    """
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise ValueError(f"{src}: no {count_key} in its metadata")
    n_total = int(reader.fields[count_key].contents())
    if not 1 <= n_layers <= n_total:
        raise ValueError(f"--layers must be between 1 and {n_total} for {src.name}, got {n_layers}")
    tmp = dst.with_name(dst.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer writes these itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == count_key:
            value = n_layers
        elif field.name == "general.name":
            value = f"{value} (draft: first {n_layers} of {n_total} blocks)"
        elif field.name.startswith(arch + ".") and vtype == gguf.GGUFValueType.ARRAY and len(value) == n_total:
            value = value[:n_layers]  # per-layer settings
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for tensor in reader.tensors:
        m = _BLOCK.match(tensor.name)
        if (m and int(m.group(1)) < n_layers) or tensor.name.startswith(KEEP):
            writer.add_tensor(tensor.name, tensor.data, raw_shape=None, raw_dtype=tensor.tensor_type)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, dst)
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the target model's GGUF")
    ap.add_argument("dst", type=Path, help="where to write the draft GGUF")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks to keep (default 4)")
    args = ap.parse_args(argv)
    try:
        out = make_draft_gguf(args.src, args.dst, args.layers)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: {out.stat().st_size} bytes, first {args.layers} blocks of {args.src.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
