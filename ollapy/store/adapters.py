"""Adapter and quantization steps of ``ollapy create``: the store's side (no llama.cpp here).

* ``ADAPTER <path>`` (Modelfile) and ``adapters`` (``/api/create``: file name -> blob digest) name LoRA adapter
  GGUFs. :func:`adapter_layer` checks the file's header (``general.type`` ``adapter``, ``adapter.type`` ``lora``,
  the base model's architecture) before it is stored as a manifest layer of media type
  ``application/vnd.ollama.image.adapter``, as Ollama stores it; llama.cpp applies it at load time
  (:mod:`ollapy.engine.backend.adapters`).
* ``--quantize TYPE`` / ``quantize`` re-encodes an F16 or F32 model GGUF into ``TYPE`` (Ollama's rule: only those
  sources; Ollama's error text for others). The quantizer itself is llama.cpp's ``llama_model_quantize``
  (:mod:`ollapy.engine.backend.quantize`), passed in by the caller as a :class:`Quantizer` so that the store stays
  below the engine; :func:`quantized_layer` writes its output as a new content-addressed blob.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ollapy.errors import ModelLoadError, UsageError
from ollapy.store.info import read_gguf_header

#: llama.cpp's ``general.file_type`` values a quantization may start from (``LLAMA_FTYPE_ALL_F32``,
#: ``LLAMA_FTYPE_MOSTLY_F16``), as Ollama allows; BF16 (32) too, which llama-quantize reads like F16.
QUANTIZABLE_FILE_TYPES = {0: "F32", 1: "F16", 32: "BF16"}

#: the quantization types ``create --quantize`` offers (llama-quantize's names), by their lowercase spelling
QUANT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K_S", "q3_K_M", "q3_K_L", "q4_K_S", "q4_K_M",
               "q5_K_S", "q5_K_M", "q6_K")


class Quantizer(Protocol):
    """llama.cpp's quantizer, as the engine offers it: ``quantize(src, dst, type_name, progress)`` writes ``dst``
    from ``src``; ``progress(done, total)`` counts tensors. Raises ModelLoadError when llama.cpp fails."""

    def __call__(self, src: Path, dst: Path, type_name: str, progress: Callable[[int, int], None]) -> None: ...


def quant_type(name: str) -> str:
    """The canonical spelling of a quantization type (``Q4_K_M``, ``q4_k_m`` -> ``q4_K_M``). Raises UsageError with
    the list of types, in Ollama's words, for one ollapy does not offer."""
    want = name.strip().lower()
    for t in QUANT_TYPES:
        if t.lower() == want:
            return t
    raise UsageError(f"unsupported quantization type {name.strip()[:40]!r}",
                     hint="supported types are " + ", ".join(t.upper() for t in QUANT_TYPES))


def check_quantizable(path: Path) -> str:
    """The source file type's name (``F16``, ``F32``, ``BF16``) of a model GGUF that may be quantized. Raises
    UsageError (Ollama's words) for an already quantized model, ModelLoadError for an unreadable header."""
    meta, _ = read_gguf_header(path)
    ft = meta.get("general.file_type")
    if ft not in QUANTIZABLE_FILE_TYPES:
        raise UsageError("quantization is only supported for F16 and F32 models",
                         hint="create from the model's F16, BF16 or F32 GGUF, or do not ask to quantize it")
    return QUANTIZABLE_FILE_TYPES[ft]


def quantized_layer(own, src: Path, type_name: str, quantize: Quantizer,
                    progress: Callable[[int, int], None]) -> dict[str, Any]:
    """Quantize ``src`` into a new blob of store ``own`` and return its model layer. The output goes to a
    temporary file in the blobs folder, is hashed, and is renamed to ``sha256-<hex>`` only when complete; a
    failure leaves nothing behind. Raises UsageError (source not F16/F32), ModelLoadError (llama.cpp failed)."""
    from ollapy.store.layout import MT_MODEL

    check_quantizable(src)
    blobs = own.blobs
    blobs.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=blobs, prefix=".quantize-", suffix=".gguf")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        quantize(src, tmp, type_name, progress)
        h = hashlib.sha256()
        with open(tmp, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        hexd = h.hexdigest()
        size = tmp.stat().st_size
        os.replace(tmp, own.blob_path(f"sha256:{hexd}"))
    finally:
        tmp.unlink(missing_ok=True)
    return {"mediaType": MT_MODEL, "digest": f"sha256:{hexd}", "size": size,
            "filename": f"{src.stem}-{type_name}.gguf"}


def check_adapter(path: Path, given: str, base_arch: str | None) -> None:
    """Refuse a file that is not a LoRA adapter GGUF for a model of ``base_arch`` (None: not checked). Raises
    UsageError with one line naming what is wrong; the text never depends on anything but the header read."""
    try:
        meta, _ = read_gguf_header(path)
    except ModelLoadError:
        raise UsageError(f"ADAPTER {given}: not a GGUF file",
                         hint="ADAPTER names a LoRA adapter GGUF (convert_lora_to_gguf.py writes one)") from None
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise UsageError(f"ADAPTER {given}: not a LoRA adapter GGUF",
                         hint="ADAPTER names a LoRA adapter (general.type adapter, adapter.type lora)")
    arch = meta.get("general.architecture")
    if base_arch and arch != base_arch:
        raise UsageError(f"ADAPTER {given}: an adapter for {arch!s:.40} models, not {base_arch!s:.40}",
                         hint="use the adapter made for this base model")


def adapter_layer(own, path: Path, given: str, base_arch: str | None) -> dict[str, Any]:
    """The manifest layer of one adapter file, linked into store ``own`` like a model. Raises UsageError."""
    from ollapy.store.layout import MT_ADAPTER
    from ollapy.store.resolve import _file_layer

    if not path.is_file():
        raise UsageError(f"ADAPTER {given}: no such file", hint="ADAPTER names a LoRA adapter GGUF")
    check_adapter(path, given, base_arch)
    return _file_layer(own, path, MT_ADAPTER)


def model_architecture(path: Path) -> str | None:
    """A model GGUF's ``general.architecture`` (None when its header does not say)."""
    try:
        return read_gguf_header(path)[0].get("general.architecture")
    except ModelLoadError:
        return None
