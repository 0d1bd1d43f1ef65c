"""ggml's RPC backend through its registry: remote devices for a model, and serving this machine's devices.

Everything goes through ggml's own implementation (``ggml/src/ggml-rpc``), reached the way llama.cpp's tools
reach it: ``ggml_backend_reg_by_name("RPC")`` and ``ggml_backend_reg_get_proc_address`` for
``ggml_backend_rpc_add_server`` (client) and ``ggml_backend_rpc_start_server`` (server). A build without
``-DGGML_RPC=ON`` has no "RPC" registry: :func:`supports_rpc` is false and the calls here raise
:class:`~ollapy.errors.RpcUnavailable` with the rebuild hint.

Unlike llama.cpp's ``--rpc`` (which registers the remote devices process-wide with ``ggml_backend_register``,
so every later model would use them), a model gets its devices through ``llama_model_params.devices``
(:func:`model_devices`): RPC devices first, in endpoint order, then this machine's GPUs (integrated ones only
when there is no discrete GPU), the order llama.cpp's default selection uses (``src/llama.cpp``), so
``tensor_split`` and ``num_gpu`` mean what they mean there. The CPU is not in the list: layers that are not
offloaded (``num_gpu`` below the layer count) stay on it.

The RPC client aborts the process when an endpoint is unreachable or lost (``GGML_ABORT``): callers run
:func:`ollapy.rpc_endpoint.check_endpoints` first, and models that use RPC run in a child runner process.
"""
from __future__ import annotations

import ctypes
import threading

from ollapy.engine.backend import vulkan
from ollapy.engine.backend.bindings import C, init_backend
from ollapy.errors import RpcUnavailable

DEVICE_CPU, DEVICE_GPU, DEVICE_ACCEL, DEVICE_IGPU = 0, 1, 2, 3  # enum ggml_backend_dev_type (ggml-backend.h)
_REBUILD = ("reinstall llama-cpp-python with the RPC backend: bash scripts/install_llama.sh .venv/bin/python "
            "(CMAKE_ARGS=-DGGML_RPC=ON)")
_lock = threading.Lock()
_typed = False


def _lib():
    """libllama's handle with the ggml registry functions typed (they resolve through its dependencies)."""
    global _typed
    lib = C._lib
    with _lock:
        if not _typed:
            vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
            for name, res, args in (
                ("ggml_backend_reg_by_name", vp, [cp]), ("ggml_backend_reg_name", cp, [vp]),
                ("ggml_backend_reg_get_proc_address", vp, [vp, cp]),
                ("ggml_backend_reg_dev_count", sz, [vp]), ("ggml_backend_reg_dev_get", vp, [vp, sz]),
                ("ggml_backend_dev_count", sz, []), ("ggml_backend_dev_get", vp, [sz]),
                ("ggml_backend_dev_by_name", vp, [cp]), ("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
                ("ggml_backend_dev_type", ctypes.c_int, [vp]), ("ggml_backend_dev_backend_reg", vp, [vp]),
                ("ggml_backend_dev_name", cp, [vp]), ("ggml_backend_dev_description", cp, [vp]),
                ("ggml_backend_dev_memory", None, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
            ):
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _typed = True
    return lib


def supports_rpc() -> bool:
    """True when this build of llama.cpp has the RPC backend (``llama_supports_rpc``)."""
    init_backend()
    return bool(C.llama_supports_rpc())


def _rpc_reg():
    init_backend()
    reg = _lib().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RpcUnavailable("this build of llama.cpp has no RPC backend", _REBUILD)
    return reg


def _proc(name: str, restype, *argtypes):
    addr = _lib().ggml_backend_reg_get_proc_address(_rpc_reg(), name.encode())
    if not addr:
        raise RpcUnavailable(f"the RPC backend of this build lacks {name}", _REBUILD)
    return ctypes.CFUNCTYPE(restype, *argtypes)(addr)


def describe_device(dev: int) -> dict:
    """``{"name", "description", "type" ("cpu"|"gpu"|"accel"|"igpu"), "backend", "free", "total"}`` of a device:
    ``backend`` is its ggml registry's name ("CPU", "Vulkan", "RPC"...), memory in bytes."""
    lib = _lib()
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind = {DEVICE_CPU: "cpu", DEVICE_GPU: "gpu", DEVICE_ACCEL: "accel", DEVICE_IGPU: "igpu"}.get(
        lib.ggml_backend_dev_type(dev), "other")
    return {"name": (lib.ggml_backend_dev_name(dev) or b"").decode(),
            "description": (lib.ggml_backend_dev_description(dev) or b"").decode(),
            "type": kind, "backend": (lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)) or b"").decode(),
            "free": free.value, "total": total.value}


def remote_devices(endpoints: tuple[str, ...] | list[str]) -> list[int]:
    """The devices of each RPC server, in endpoint order (``ggml_backend_rpc_add_server``; one connection
    per endpoint, kept by ggml for the process). Check the endpoints first (see the module docstring).
    Raises RpcUnavailable on a build without RPC or a server with no device."""
    add_server = _proc("ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
    lib = _lib()
    out: list[int] = []
    for ep in endpoints:
        reg = add_server(ep.encode())
        if not reg:
            raise RpcUnavailable(f"RPC server {ep} has no device to offer", endpoint=ep)
        out.extend(lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg)))
    return out


def local_gpus() -> list[int]:
    """This machine's GPU devices as llama.cpp's default selection takes them: discrete GPUs (not RPC), or the
    integrated ones when there is none."""
    init_backend()
    lib = _lib()
    gpus, igpus = [], []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        if kind == DEVICE_GPU and (lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)) or b"") != b"RPC":
            gpus.append(dev)
        elif kind == DEVICE_IGPU:
            igpus.append(dev)
    return gpus or igpus


def model_devices(endpoints: tuple[str, ...] | list[str], local: list[int] | None = None) -> list[int]:
    """Devices for ``llama_model_params.devices`` of a model using ``endpoints``: remote ones, then ``local``
    (default: :func:`local_gpus`)."""
    return remote_devices(endpoints) + (local_gpus() if local is None else local)


def serving_devices(names: list[str] | None = None) -> list[int]:
    """Devices an RPC server offers: those named (``CUDA0``, ``CPU``…), else every non-CPU device but a software
    Vulkan device (opt-in: :mod:`.vulkan`), else the CPU (llama.cpp's ``rpc-server`` rule). Raises RpcUnavailable
    naming the devices there are for an unknown name."""
    init_backend()
    lib = _lib()
    if names:
        out = []
        for n in names:
            dev = lib.ggml_backend_dev_by_name(n.encode())
            if not dev:
                have = ", ".join(describe_device(lib.ggml_backend_dev_get(i))["name"]
                                 for i in range(lib.ggml_backend_dev_count()))
                raise RpcUnavailable(f"no device named {n!r}", f"devices here: {have}")
            out.append(dev)
        return out
    out = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    out = [d for d in out if lib.ggml_backend_dev_type(d) not in (DEVICE_CPU, DEVICE_ACCEL)]
    if vulkan.software_only():  # a software Vulkan device serves only when named (--device Vulkan0)
        out = [d for d in out if d not in local_gpus()]
    return out or [lib.ggml_backend_dev_by_type(DEVICE_CPU)]


def start_server(endpoint: str, devices: list[int], n_threads: int, cache_dir: str | None = None) -> None:
    """Serve ``devices`` at ``endpoint`` (``host:port``) with ggml's ``ggml_backend_rpc_start_server``.

    Blocks for as long as it serves (ggml has no stop call; ctypes releases the GIL, so run it on a thread and
    end the process to stop). Returns only when ggml gives up (it prints why on stderr, e.g. the port is
    taken). ``n_threads``: CPU threads for the CPU device; ``cache_dir``: ggml's tensor cache (large tensors
    sent once by hash), or None.
    """
    start = _proc("ggml_backend_rpc_start_server", None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                  ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
    arr = (ctypes.c_void_p * len(devices))(*devices)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), arr)
