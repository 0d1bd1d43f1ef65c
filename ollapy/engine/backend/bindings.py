"""llama-cpp-python's ctypes bindings: loading them, finishing the package import, and library-wide facts.

One of the modules of ``ollapy/engine`` that touch ``llama_cpp`` (with
:mod:`.backend`, :mod:`.templating` and :mod:`.embedding`). ``C`` is the
bindings module (``llama_cpp.llama_cpp``); ``np`` is numpy once
:func:`finish_imports` has returned (``None`` before).

CPU safety: on CPUs with AMX and a build of ggml with AMX kernels, ggml's AMX
"extra buffer type" segfaults in ``ggml_backend_amx_mul_mat`` on every decode
(see shared/ENVIRONMENT.md). :func:`choose_extra_bufts` therefore turns extra
buffer types off only when both the CPU and the build have AMX, and keeps CPU
weight repacking everywhere else. ``OLLAPY_EXTRA_BUFTS`` / the ``extra_bufts``
option override it.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path

from ollapy.engine.backend import vulkan
from ollapy.engine.hardware import cpu_has_amx

log = logging.getLogger("ollapy.engine")


def _import_bindings():
    """llama-cpp-python's ctypes bindings (``llama_cpp.llama_cpp``), without running the package's ``__init__``.

    ``import llama_cpp`` first imports the high-level ``Llama`` class and with it
    numpy, jinja2 and the chat formats (a large share of a one-shot
    ``ollapy run``'s own start-up overhead: ``scripts/bench_cli.py``). The bindings alone are enough to load a
    model, so the package module is registered unexecuted and
    :func:`finish_imports` runs its ``__init__`` in a thread while the model
    loads (``llama_model_load_from_file`` releases the GIL).
    """
    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is not None and spec.loader is not None and spec.submodule_search_locations is not None:
            sys.modules["llama_cpp"] = importlib.util.module_from_spec(spec)
    from llama_cpp import llama_cpp as bindings

    return bindings


vulkan.expose_software_device()  # before ggml reads GGML_VK_VISIBLE_DEVICES (at its first device enumeration)
C = _import_bindings()
np = None  # numpy: bound by _complete_imports(), which every Backend waits for
_imports_thread: threading.Thread | None = None
_imports_error: BaseException | None = None
_imports_lock = threading.Lock()


def _complete_imports() -> None:
    global np, _imports_error
    try:
        pkg = sys.modules["llama_cpp"]
        if not hasattr(pkg, "__version__"):  # registered unexecuted by _import_bindings
            pkg.__spec__.loader.exec_module(pkg)
            if _initialised and not _debug():
                _silence_llama_log()  # the package just installed its own callback
        import llama_cpp.llama_chat_format  # noqa: F401 - the template renderer, warmed up
        import numpy

        np = numpy
    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by finish_imports()
        _imports_error = exc


def start_imports() -> None:
    """Start importing the rest of llama-cpp-python (and numpy) in a background thread; idempotent."""
    global _imports_thread
    with _imports_lock:
        if _imports_thread is None:
            _imports_thread = threading.Thread(target=_complete_imports, name="ollapy-imports", daemon=True)
            _imports_thread.start()


def finish_imports() -> None:
    """Wait for :func:`start_imports` (starting it if needed); raises what the imports raised."""
    start_imports()
    assert _imports_thread is not None
    _imports_thread.join()
    if _imports_error is not None:
        raise _imports_error





_initialised = False
#: ggml-cpu's switch for its tiled K-quant matmul (read once per process)
TILED_ENV = "GGML_CPU_TILED_MM"


def _debug() -> bool:
    return os.environ.get("OLLAPY_DEBUG", "0") in {"1", "true", "yes"}


def init_backend() -> None:
    """``llama_backend_init`` once per process, with llama.cpp's log silenced unless OLLAPY_DEBUG is set."""
    global _initialised
    if not _initialised:
        if not _debug():
            # llama-cpp-python's own log callback (installed when its package finishes importing, see
            # _complete_imports) prints whatever its logger's level lets through: let nothing through
            logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL + 1)
            _silence_llama_log()
        # ggml-cpu multiplies K-quant weights (Q4_K, Q6_K...) with its "tiled" kernel from 8 rows of a batch up and
        # with vec_dot below (ggml-cpu/tiled/tiled.cpp, ggml_tiled_min_batch): a row would round differently in a
        # 7-row and an 8-row batch. Off, so that every row computes alike in any batch (engine/speculation.py);
        # read once, at the first product. GGML_CPU_TILED_MM=1 in the environment keeps it (row_invariant False).
        os.environ.setdefault(TILED_ENV, "0")
        C.llama_backend_init()
        _initialised = True
        if vulkan.NOTE:
            log.debug("%s", vulkan.NOTE)


@C.llama_log_callback
def _discard_log(level, text, user_data):  # pragma: no cover - C callback
    return None


def _silence_llama_log() -> None:
    """Route llama.cpp's own logging to nothing (errors still surface as return codes).

    The callback is one module-level object that is never freed: another
    thread may be inside a log call while the callback is swapped.
    """
    C.llama_log_set(_discard_log, ctypes.c_void_p(0))


def library_version() -> str:
    """Version of the installed llama-cpp-python package."""
    finish_imports()
    return getattr(sys.modules["llama_cpp"], "__version__", "unknown")


def system_info() -> str:
    """llama.cpp's ``llama_print_system_info`` line (features compiled in and detected)."""
    init_backend()
    return C.llama_print_system_info().decode("utf-8", "replace").strip()


def supports_gpu_offload() -> bool:
    """True when this machine has a GPU this build of llama.cpp offloads layers to by default: not a software
    Vulkan device alone, which is opt-in (:mod:`.vulkan`).

    Not ``llama_supports_gpu_offload``: that is also true for any build with the RPC backend, GPU or not.
    """
    from ollapy.engine.backend.rpc import local_gpus

    return bool(local_gpus()) and not vulkan.software_only()


def tiled_matmul_on() -> bool:
    """True when ggml-cpu's tiled K-quant matmul is on (``GGML_CPU_TILED_MM`` not 0): batches of 8 rows and more
    then round differently from smaller ones (see :func:`init_backend`)."""
    try:
        return int(os.environ.get(TILED_ENV, "1")) != 0
    except ValueError:
        return True


def build_has_llamafile() -> bool:
    """True when ggml-cpu was built with llamafile's tinyBLAS (``GGML_LLAMAFILE``, llama.cpp's default)."""
    return "LLAMAFILE = 1" in system_info()


MARKER = ".ollapy-llama-patches"
"""The file in ``sys.prefix`` where scripts/install_llama.sh records its patches, keyed to what it installed."""
PATCHED_LIBRARY = "libggml-cpu.so"
"""The library the patches change (ggml-cpu's llamafile sgemm)."""


def patched_library() -> Path | None:
    """The installed ``llama_cpp/lib/libggml-cpu.so`` (found without importing llama_cpp), None without one."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "lib" / PATCHED_LIBRARY
    return path if path.is_file() else None


@functools.lru_cache(maxsize=1)
def patch_marker() -> tuple[frozenset[str], str]:
    """``(patches, note)``: the patches scripts/install_llama.sh recorded in ``sys.prefix/`` :data:`MARKER`
    when the marker names the installed llama-cpp-python version and the sha256 of the installed
    :data:`PATCHED_LIBRARY`, else no patches and a note saying why (a stock build: another version or library
    file, e.g. after ``pip install -U llama-cpp-python``; an old marker without a key; no marker). The note is
    ``""`` when the patches count. Hashes the library once per process (about a megabyte)."""
    import hashlib
    import importlib.metadata
    import json

    fix = "re-run scripts/install_llama.sh for the patched build"
    try:
        text = (Path(sys.prefix) / MARKER).read_text()
    except OSError:
        return frozenset(), "no patch marker (llama-cpp-python was not installed by scripts/install_llama.sh)"
    try:
        marker = json.loads(text)
        patches, version, digest = marker["patches"], marker["llama_cpp_python"], marker["sha256"]
    except (ValueError, KeyError, TypeError):
        return frozenset(), f"the patch marker names no library version or hash ({fix})"
    try:
        installed = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        installed = "none"
    if version != installed:
        return frozenset(), f"the patch marker is for llama-cpp-python {version}, {installed} is installed ({fix})"
    lib = patched_library()
    if lib is None or hashlib.sha256(lib.read_bytes()).hexdigest() != digest:
        return frozenset(), f"the installed {PATCHED_LIBRARY} differs from the one the patch marker records ({fix})"
    return frozenset(str(p) for p in patches), ""


def build_patches() -> frozenset[str]:
    """The patches scripts/install_llama.sh applied to the vendored llama.cpp of this environment, when its
    marker is keyed to the library installed now (:func:`patch_marker`); empty for any other install."""
    return patch_marker()[0]


def one_row_products_differ() -> bool:
    """True when ggml-cpu multiplies a one-row product with another kernel than a multi-row one: a stock build
    with tinyBLAS, whose ``llamafile_sgemm`` declines ``n < 2`` (the one row then goes to ``vec_dot`` and rounds
    differently). scripts/install_llama.sh patches the guard to ``n < 1`` (``sgemm-one-row``)."""
    return build_has_llamafile() and "sgemm-one-row" not in build_patches()


@functools.lru_cache(maxsize=1)
def state_set_segments_fn():
    """``llama_state_seq_set_data_segments`` (added by scripts/patch_state_segments.py), or None in a build without it.

    ``fn(ctx, ptrs, sizes, n_segments, seq_id, flags) -> size_t``: reads a sequence state given as
    ``n_segments`` pieces (``ptrs``: ``const uint8_t * const *``, ``sizes``: ``const size_t *``) without joining
    them; returns the bytes read, 0 on failure.
    """
    lib = getattr(C, "_lib", None)
    fn = getattr(lib, "llama_state_seq_set_data_segments", None) if lib is not None else None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_uint32]
    fn.restype = ctypes.c_size_t
    return fn


def build_has_amx() -> bool:
    """True when the loaded ggml CPU backend was built with AMX kernels."""
    info = system_info()
    return "AMX_INT8 = 1" in info or "AMX_BF16 = 1" in info or "AMX = 1" in info


def choose_extra_bufts(setting: str) -> tuple[bool, str]:
    """Decide whether to use CPU extra buffer types (repacking, AMX).

    ``setting`` is ``auto``, ``on`` or ``off``; ``on`` is refused (off) where the CPU and the build both have AMX,
    the one case known to crash. Returns ``(use, reason)``; the
    reason is a short human sentence shown by ``ollapy info`` and the debug log.
    """
    amx_crash = cpu_has_amx() and build_has_amx()
    if setting == "on" and amx_crash:  # honouring it would segfault on the first decode: never do
        return False, "off (extra_bufts=on refused: AMX CPU and AMX build; ggml's AMX path crashes)"
    if setting == "on":
        return True, "on (forced by extra_bufts=on)"
    if setting == "off":
        return False, "off (forced by extra_bufts=off)"
    if amx_crash:
        return False, "off (auto: AMX CPU and AMX build; ggml's AMX path crashes, repacking disabled)"
    # repacked weights multiply rows in groups of 4 (ggml-cpu repack.cpp), so a row's logits would depend on the
    # rows beside it: concurrency and speculative drafting could change a greedy answer (engine/speculation.py)
    return False, "off (auto: no weight repacking, so every row computes alike in any batch)"


def devices() -> list[dict]:
    """The ggml devices this build found, in ggml's order: ``{"name", "description", "type" ("cpu"|"gpu"|"accel"|
    "igpu"), "backend" (ggml registry: "CPU", "Vulkan", "CUDA"...), "free", "total"}``, memory in bytes."""
    from ollapy.engine.backend import rpc

    init_backend()
    lib = rpc._lib()
    return [rpc.describe_device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]
