"""Quantizing a GGUF with llama.cpp's ``llama_model_quantize`` (what ``llama-quantize`` runs; ``tools/quantize``).

:func:`quantize_gguf` writes ``dst`` from an F16/F32 ``src`` in one of llama-quantize's types (``q4_K_M``,
``q8_0``...), with llama.cpp's default choices per tensor (``llama_model_quantize_default_params``: the output
tensor quantized too, 1-D tensors kept in F32, no importance matrix). llama.cpp reports no progress through its
API; it logs one line per tensor (``[  12/ 272] blk.0.attn_q.weight - ...``), so while it runs a log callback reads
those lines and calls ``progress(done, total)``. The callback is module-level (never freed) and only one
quantization runs at a time (a lock); llama.cpp's logging is routed back to nothing afterwards.
"""
from __future__ import annotations

import ctypes
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ollapy.engine.backend.bindings import C, _debug, _silence_llama_log, init_backend
from ollapy.errors import ModelLoadError

#: llama-quantize's type names -> llama.cpp's ``llama_ftype`` (``include/llama.h``)
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_K": 10, "q3_K_S": 11, "q3_K_M": 12,
          "q3_K_L": 13, "q4_K_S": 14, "q4_K_M": 15, "q5_K_S": 16, "q5_K_M": 17, "q6_K": 18}

_TENSOR_LINE = re.compile(rb"\[\s*(\d+)/\s*(\d+)\]")
_lock = threading.Lock()
_progress: Callable[[int, int], None] | None = None
_DEBUG = _debug()  # OLLAPY_DEBUG: llama.cpp's log still reaches stderr


@C.llama_log_callback
def _read_progress(level, text, user_data):  # pragma: no cover - C callback
    if _DEBUG:
        sys.stderr.write((text or b"").decode("utf-8", "replace"))
    m = _TENSOR_LINE.search(text or b"")
    if m and _progress is not None:
        try:
            _progress(int(m.group(1)), int(m.group(2)))
        except Exception:  # noqa: BLE001 - a failing progress bar never breaks the quantization
            pass


def quantize_gguf(src: Path, dst: Path, type_name: str, progress: Callable[[int, int], None] = lambda d, t: None,
                  threads: int = 0) -> None:
    """Quantize ``src`` into ``dst`` as ``type_name`` (a key of :data:`FTYPES`). ``threads`` 0: llama.cpp's
    choice (all hardware threads). Raises ModelLoadError when llama.cpp fails (it leaves ``dst`` to the caller),
    KeyError for an unknown type (callers check with :func:`ollapy.store.adapters.quant_type`)."""
    global _progress
    ftype = FTYPES[type_name]
    init_backend()
    params = C.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    with _lock:
        _progress = progress
        C.llama_log_set(_read_progress, ctypes.c_void_p(0))
        try:
            rc = C.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
        finally:
            _progress = None
            if not _DEBUG:  # with OLLAPY_DEBUG the callback stays: it forwards llama.cpp's log to stderr
                _silence_llama_log()
    if rc != 0:
        raise ModelLoadError(f"llama.cpp could not quantize {src.name} to {type_name} (error {rc})",
                             hint="set OLLAPY_DEBUG=1 for llama.cpp's log")
