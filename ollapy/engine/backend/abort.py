"""An abort flag that llama.cpp's CPU backend polls inside ``llama_decode``, read without Python.

Why. A cancelled request (an editor's completion abandoned at the next keystroke, Ctrl-C) ended at the start
of the engine's next step, so its slot stayed busy for the whole step in flight: the client closes right after
a token arrives, which is right after the next step began, so a cancel freed the slot one full step late (a
decode step of the 1.5B model is ~45 ms on 2 cores, a prefill chunk seconds), and the next request waited for
it. llama.cpp has the hook for this: ``llama_set_abort_callback``; ggml-cpu's first compute thread calls it
after every graph node and stops the graph when it returns true, and ``llama_decode`` then removes the failed
ubatch's cells and returns 2 (``llama_context::decode``).

How, without Python in the loop. A Python callback (a ctypes ``CFUNCTYPE``) would take the GIL after every
one of the graph's ~700-1,000 nodes, from a compute thread the others wait for at the next barrier. Instead
the callback is ggml's own ``ggml_is_empty(const struct ggml_tensor *)`` (public API: true when any ``ne[i]``
is 0), given a tensor header that this object owns and that nothing else reads: ``ne`` all 1 means go on,
``ne[0] = 0`` means abort. Setting or clearing the flag is one aligned 8-byte store from any thread; the poll
is a few loads in C. Only the leading fields of ``struct ggml_tensor`` up to ``ne`` are laid out (``type``,
``buffer``, ``ne[4]``: ggml.h), which is all ``ggml_is_empty`` reads.

Backends other than the CPU's ignore the callback (llama.cpp passes it on to those that export
``ggml_backend_set_abort_callback``); there a cancel still ends at the step's end.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger("ollapy.engine")

GGML_MAX_DIMS = 4


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml.h's ``struct ggml_tensor``, up to ``ne`` (what ``ggml_is_empty`` reads)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * GGML_MAX_DIMS)]


def _find_is_empty(lib_dir: Path):
    """ggml's ``ggml_is_empty`` from the ggml base library next to llama-cpp-python's ``libllama``; None when
    there is no such library (then decodes are never aborted)."""
    for pattern in ("libggml-base.so*", "libggml-base.dylib", "ggml-base.dll", "libggml.so*", "libggml.dylib",
                    "ggml.dll"):
        for path in sorted(lib_dir.glob(pattern)):
            try:
                fn = ctypes.CDLL(str(path)).ggml_is_empty  # already loaded by libllama: the same handle
            except (OSError, AttributeError):
                continue
            return fn
    return None


class AbortFlag:
    """One llama context's abort flag (see the module docstring). Owned by its Backend; it must outlive the
    context, which holds a pointer to it.

    ``install(C, ctx)`` registers it; :meth:`set` makes the decode in flight (or the next one) stop at the next
    graph node; :meth:`clear` before each decode. ``supported`` is False when ggml's function was not found
    (nothing is then installed and :meth:`set` does nothing).
    """

    def __init__(self, bindings) -> None:
        self._head = _TensorHead(0, None, (1,) * GGML_MAX_DIMS)
        self._fn = None
        lib_dir = Path(bindings.__file__).resolve().parent / "lib"
        is_empty = _find_is_empty(lib_dir)
        if is_empty is not None:
            address = ctypes.cast(is_empty, ctypes.c_void_p).value
            self._fn = bindings.ggml_abort_callback(address)  # a C function pointer: no Python when called
        self.supported = self._fn is not None

    def install(self, bindings, ctx) -> None:
        """Register the flag as ``ctx``'s abort callback (``llama_set_abort_callback``)."""
        if self._fn is None:
            log.debug("no ggml_is_empty found: cancelled decodes run to their end")
            return
        bindings.llama_set_abort_callback(ctx, self._fn, ctypes.cast(ctypes.pointer(self._head), ctypes.c_void_p))

    def set(self) -> None:
        """Abort the decode in flight at its next graph node (any thread)."""
        self._head.ne[0] = 0

    def clear(self) -> None:
        """Let decodes run (before each one; loop thread)."""
        self._head.ne[0] = 1

    @property
    def is_set(self) -> bool:
        """True while a decode would be aborted."""
        return self._head.ne[0] == 0
