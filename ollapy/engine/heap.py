"""Giving the C heap's free memory back to the system after a model is unloaded (glibc's ``malloc_trim``).

A model's unload frees its prompt cache's RAM tier (Python bytes of KV blocks), llama.cpp's buffers and its
threads' scratch memory. glibc keeps freed chunks inside its arenas, and returns an arena's memory to the system
only from the arena's top: free chunks below a live allocation stay resident. Once glibc has raised its dynamic
mmap threshold (it does when a large mmapped chunk is freed), even buffers of several MiB come from the arenas,
so each unload and reload of a model in a long-running server leaves more of them resident. ``malloc_trim(0)``
releases the free pages of every arena (``madvise(MADV_DONTNEED)`` on whole free pages, glibc >= 2.8).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("ollapy.engine")


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``int malloc_trim(size_t pad)``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system (``malloc_trim(0)``); True when glibc released memory.

    A no-op returning False where the C library has no ``malloc_trim``. Safe from any thread while others
    allocate (glibc locks each arena in turn); it walks every arena, so call it after an unload, not per request.
    """
    fn = _malloc_trim()
    if fn is None:
        return False
    released = bool(fn(0))
    log.debug("heap: malloc_trim released memory: %s", released)
    return released
