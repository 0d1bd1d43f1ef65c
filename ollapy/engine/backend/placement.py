"""Where a model's layers go (local GPUs, RPC servers, the CPU) and what that makes of its KV bytes.

:func:`place_layers` fills llama.cpp's model parameters (devices, ``n_gpu_layers``, ``tensor_split``) from a
:class:`~.context.ContextConfig`; :func:`compute_identity` names what computes a model's KV cells (devices, layers,
split, repacking, row invariance), a part of the prompt cache's salt.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from ollapy.engine.backend.bindings import C

if TYPE_CHECKING:
    from ollapy.engine.backend.context import ContextConfig


def place_layers(mp, cfg: ContextConfig) -> tuple[bool, list[dict], list]:
    """Set ``mp``'s devices, ``n_gpu_layers`` and ``tensor_split``; return (offloading, device facts, the ctypes
    arrays ``mp`` points into, which must live until the model is loaded)."""
    from ollapy.engine.backend import rpc, vulkan

    keep: list = []
    facts: list[dict] = []
    local = rpc.local_gpus()
    # a software Vulkan device ollapy made visible is opt-in (num_gpu > 0): otherwise the model gets no local
    # device at all, so llama.cpp neither offloads a prompt's large products to it nor uses its host buffers
    declined = bool(local) and cfg.num_gpu <= 0 and vulkan.software_only()
    if declined:
        local = []
    if cfg.rpc or declined:
        devs: list = []
        if cfg.rpc:
            from ollapy.rpc_endpoint import check_endpoints

            check_endpoints(cfg.rpc)  # ggml's client aborts the process on a refused or failed connection
            devs = rpc.model_devices(cfg.rpc, local)
            facts = [rpc.describe_device(d) for d in devs]
        arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
        mp.devices = ctypes.cast(arr, ctypes.c_void_p).value
        keep.append(arr)
    offload = bool(cfg.rpc) or bool(local)
    mp.n_gpu_layers = (999 if cfg.num_gpu < 0 else cfg.num_gpu) if offload else 0
    if cfg.tensor_split:
        n = C.llama_max_devices()
        split = (ctypes.c_float * n)(*list(cfg.tensor_split)[:n])
        mp.tensor_split = split
        keep.append(split)
    return offload, facts, keep


def compute_identity(b, cfg: ContextConfig) -> dict:
    """What computes a model's KV cells besides the KV settings, as JSON-able values (a part of the cache salt,
    :func:`ollapy.cache.salt.kv_salt`): the devices holding layers (each one's ggml backend and description, in
    placement order: remote ones and local GPUs; none for the CPU alone), how many layers they hold and the split
    between them (``num_gpu``, ``tensor_split``, the RPC layout), repacked weights (``extra_bufts``), and whether
    every row computes alike whatever the batch (``row_invariant``) and a finished state keeps its answer
    (``answer_reuse``). Kernels that round differently compute other KV bytes: a state one of these made is
    not what another's cold prefill would compute, so a restore there could change a greedy answer."""
    devices: list[str] = []
    if b.gpu_offload:
        from ollapy.engine.backend import rpc

        facts = b.devices or [rpc.describe_device(d) for d in rpc.local_gpus()]
        devices = [f"{f.get('backend', '')}:{f.get('description', '')}" for f in facts]
    return {"devices": devices, "gpu_layers": b.gpu_layers[0] if b.gpu_offload else 0,
            "tensor_split": [float(x) for x in cfg.tensor_split] if b.gpu_offload else [],
            "extra_bufts": bool(b.extra_bufts), "row_invariant": bool(b.row_invariant),
            "answer_reuse": bool(b.answer_reuse)}
