"""GGUF metadata for ``ollapy show``, read from the file header without loading the model.

``gguf.GGUFReader`` parses every tokenizer array into numpy objects, which
costs time linear in the vocabulary (49k-262k tokens for the test models;
figures: docs/benchmarks.md); ``show``
only needs a few scalar keys, so this module walks the header itself using the
``gguf`` package's type constants and skips arrays by their byte length.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from ollapy.errors import ModelLoadError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > 1 << 26:
        raise ValueError("implausible string length")
    return f.read(n).decode("utf-8", errors="replace")


class ArraySummary(str):
    """A GGUF array as :func:`read_gguf_header` gives it: shown as ``[array of N]``, ``length`` N."""

    length: int

    def __new__(cls, length: int) -> ArraySummary:
        obj = super().__new__(cls, f"[array of {length}]")
        obj.length = length
        return obj


def _value(f: BinaryIO, vtype: int, keep: bool = False) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        itype, n = _read(f, "<I"), _read(f, "<Q")
        if keep and itype == _STRING:
            return [_raw_string(f) for _ in range(n)]
        if keep and itype in _SCALARS:
            fmt = _SCALARS[itype]
            data = f.read(struct.calcsize(fmt) * n)
            if len(data) != struct.calcsize(fmt) * n:
                raise EOFError("truncated GGUF header")
            return list(struct.unpack(f"<{n}{fmt[1]}", data))
        if itype in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[itype]) * n, 1)
        else:
            for _ in range(n):
                _value(f, itype)
        return ArraySummary(n)
    raise ValueError(f"unknown GGUF value type {vtype}")


def _raw_string(f: BinaryIO) -> bytes:
    n = _read(f, "<Q")
    if n > 1 << 26:
        raise ValueError("implausible string length")
    data = f.read(n)
    if len(data) != n:
        raise EOFError("truncated GGUF header")
    return data


def read_gguf_header(path: Path, keep: frozenset[str] = frozenset()) -> tuple[dict[str, Any], int]:
    """Return (scalar metadata, parameter count). Arrays are summarised (:class:`ArraySummary`), except those named
    in ``keep``: string arrays come as ``list[bytes]`` (``tokenizer.ggml.tokens``: linear in the vocabulary size), number
    arrays as lists of numbers.
    Raises ModelLoadError, chained to the parser's error (``__cause__``: why the header does not parse)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("no GGUF magic")
            version = _read(f, "<I")
            if version < 2:
                raise ValueError(f"GGUF version {version} is too old")
            n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(f)
                meta[key] = _value(f, _read(f, "<I"), key in keep)
            n_params = 0
            for _ in range(n_tensors):
                _string(f)
                count = 1
                for _ in range(_read(f, "<I")):
                    count *= _read(f, "<Q")
                f.seek(12, 1)  # type u32 + offset u64
                n_params += count
            return meta, n_params
    except (OSError, EOFError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})", hint="re-pull the model") from exc


# architectures llama.cpp runs with non-causal attention (encoders), whether or not the GGUF says so (also used by
# ollapy.engine.backend.embedding)
ENCODER_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert",
                           "neo-bert", "eurobert", "t5encoder"})


def embedding_only_meta(meta: dict[str, Any]) -> bool:
    """True for an embedding-only model from its GGUF metadata, the rule of
    :func:`ollapy.engine.backend.embedding.is_embedding_model` (Ollama's): ``{arch}.pooling_type`` is set, or the
    architecture is an encoder (listed, or ``{arch}.attention.causal`` false)."""
    arch = meta.get("general.architecture") or ""
    if meta.get(f"{arch}.pooling_type") is not None:
        return True
    causal = meta.get(f"{arch}.attention.causal", True)
    return arch in ENCODER_ARCHS or causal is False or str(causal).lower() in ("false", "0")


def human_count(n: int) -> str:
    """12_345_678 → ``12.3M``."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


#: the spellings llama.cpp recognises as FIM prefix / suffix / middle tokens (``src/llama-vocab.cpp``, ``load``):
#: a vocabulary with one of each fills in the middle (Ollama's ``insert`` capability)
FIM_TOKEN_TEXTS = (
    {b"<|fim_prefix|>", b"<fim-prefix>", b"<fim_prefix>", "<｜fim▁begin｜>".encode(), b"<PRE>", "▁<PRE>".encode()},
    {b"<|fim_suffix|>", b"<fim-suffix>", b"<fim_suffix>", "<｜fim▁hole｜>".encode(), b"<SUF>", "▁<SUF>".encode()},
    {b"<|fim_middle|>", b"<fim-middle>", b"<fim_middle>", "<｜fim▁end｜>".encode(), b"<MID>", "▁<MID>".encode()},
)


def has_fim_tokens(path: Path) -> bool:
    """Whether the GGUF's vocabulary holds FIM prefix, suffix and middle tokens, as llama.cpp finds them by text
    (``tokenizer.ggml.tokens``; read from the header, nothing loaded). False for an unreadable file."""
    from ollapy.errors import ModelLoadError

    try:
        meta, _ = read_gguf_header(path, keep=frozenset({"tokenizer.ggml.tokens"}))
    except ModelLoadError:
        return False
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return False
    vocab = set(tokens)
    return all(vocab & texts for texts in FIM_TOKEN_TEXTS)


def read_gguf_info(path: Path) -> dict[str, Any]:
    """Return architecture, parameters, context_length, embedding_length, quantization, chat_template,
    split_count and embedding_only (:func:`embedding_only_meta`).

    Raises ModelLoadError when the file is not a readable GGUF.
    """
    import gguf

    meta, n_params = read_gguf_header(path)
    arch = meta.get("general.architecture") or "unknown"
    ftype = meta.get("general.file_type")
    try:
        quant = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_") if ftype is not None else None
    except ValueError:
        quant = str(ftype)
    return {
        "architecture": arch,
        "parameters": meta.get("general.size_label") or human_count(n_params),
        "parameter_count": n_params,
        "context_length": meta.get(f"{arch}.context_length"),
        "embedding_length": meta.get(f"{arch}.embedding_length"),
        "quantization": quant,
        "chat_template": meta.get("tokenizer.chat_template"),
        "split_count": meta.get("split.count"),
        "embedding_only": embedding_only_meta(meta),
    }


def parameter_text(value: Any) -> str:
    """One parameter value as Ollama prints it: strings in double quotes (JSON escapes), numbers bare, true/false."""
    import json

    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parameter_rows(parameters: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value text) rows for ``show``: one row per value, so a list (``stop``) gives one row each."""
    return [(k, parameter_text(item)) for k, v in parameters.items() for item in (v if isinstance(v, (list, tuple)) else [v])]
