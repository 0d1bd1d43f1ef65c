"""Load-time choices about the hardware that need no llama.cpp: AMX detection and the flash-attention policy.

Kept apart from :mod:`ollapy.engine.backend.bindings` (the llama.cpp boundary), which combines them with what the
loaded build reports.
"""
from __future__ import annotations


def cpu_has_amx() -> bool:
    """True when /proc/cpuinfo lists AMX tile support (Linux; False elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def choose_flash_attn(setting: str, kv_cache_type: str, on_gpu: bool) -> str:
    """Resolve the ``flash_attn`` option to ``on``/``off``/``auto`` (llama.cpp decides).

    ``auto``: on for quantized KV types (llama.cpp requires it), llama.cpp's own
    choice on a GPU, and off on the CPU: there, llama.cpp's flash-attention path
    makes a short prompt tail over a long KV cache several times slower with no
    gain in decode speed (figures: docs/benchmarks.md, "Notes from code"), and
    that tail is exactly what a prompt-cache hit evaluates.
    """
    if setting != "auto":
        return setting
    if kv_cache_type != "f16":
        return "on"
    return "auto" if on_gpu else "off"
