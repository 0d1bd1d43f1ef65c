#!/usr/bin/env python3
"""Dequantize a GGUF model to F16, so that tests have an F16 source for ``ollapy create --quantize``.

    python scripts/make_f16_gguf.py IN.gguf OUT.gguf

No package on PyPI ships an F16 GGUF of the test models. This writes one from a quantized test model with the
official ``gguf`` library: every metadata key is copied as it is (``general.file_type`` becomes 1,
``LLAMA_FTYPE_MOSTLY_F16``), every quantized tensor is dequantized (``gguf.quants.dequantize``) and stored as F16,
and F32/F16 tensors (norms, biases) are copied unchanged, as llama.cpp's converters keep 1-D tensors in F32.
The values are those of the quantized model, so the F16 copy answers as it does, up to rounding.

Deterministic (the same input gives the same bytes); writes ``OUT.tmp`` and renames it into place. Exit 1 with one
line when the input is not a GGUF model.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_out import gguf_file  # noqa: E402

F16_FILE_TYPE = 1  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16


def _copy_field(writer, field) -> None:
    """Copy one metadata key of a GGUFReader field to ``writer`` with its original type."""
    import gguf

    vtype = field.types[0]
    value = field.contents()
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1] if len(field.types) > 1 else gguf.GGUFValueType.STRING
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    else:
        writer.add_key_value(field.name, value, vtype)


def make_f16_gguf(src: Path, dst: Path) -> Path:
    """Write the F16 copy of ``src`` to ``dst`` (atomically) and return ``dst``. Raises ValueError for a file
    that is not a GGUF model."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(src))
    except Exception as exc:  # noqa: BLE001 - the reader's own error says why
        raise ValueError(f"{src}: not a GGUF file ({exc})") from None
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ValueError(f"{src}: no general.architecture (not a GGUF model)")
    with gguf_file(dst, arch_field.contents(), endianess=reader.endianess) as writer:
        skip = {"general.architecture", "general.file_type", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
        alignment = reader.fields.get("general.alignment")
        if alignment is not None:
            writer.data_alignment = int(alignment.contents())
        for name, field in reader.fields.items():
            if name in skip or name.startswith("GGUF."):
                continue
            _copy_field(writer, field)
        writer.add_file_type(F16_FILE_TYPE)
        for t in reader.tensors:
            shape = tuple(int(x) for x in reversed(t.shape))  # NumPy order
            if t.tensor_type in (Q.F32, Q.F16):
                data = np.asarray(t.data).reshape(shape)
            else:
                data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float16)
            writer.add_tensor(t.name, data, raw_dtype=Q.F16 if data.dtype == np.float16 else None)
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    args = ap.parse_args(argv)
    try:
        make_f16_gguf(args.src, args.dst)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(args.dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
