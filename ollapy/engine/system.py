"""What this machine's llama.cpp build offers, for callers above the engine (``ollapy info``, ``ollapy
rpc-server``): versions, ggml devices, GPU offload, the CPU safety choice, RPC.

The CLI and the server (``ollapy create --quantize`` too) reach :mod:`ollapy.engine.backend` (the llama.cpp
boundary) only through these functions. Importing this module loads nothing; each function loads llama.cpp when it is called.
"""
from __future__ import annotations


def answer_reuse_rule(row_variant_reasons: list[str], gpu_offload: bool, kv_cache_type: str = "f16") -> str:
    """Which rule decides what a finished request's state keeps, as ``ollapy info`` prints it.

    ``yes (row-invariant build)``: a finished state keeps the answer's KV cells and the next turn prefills only
    the new message and the template's turn markers (evalorder rule 3, ``Backend.answer_reuse``). ``no (...)``:
    the generated tokens are dropped and evaluated again next turn, and why: ``row_variant_reasons`` (why rows of
    a batch compute differently, e.g. a stock build), a quantized default ``kv_cache_type`` (it turns CPU flash
    attention on, whose one-row and many-row paths round differently). With a GPU the model load decides.
    """
    if row_variant_reasons:
        if any("stock build" in r for r in row_variant_reasons):
            return "no (stock build)"
        return "no (" + ", ".join(row_variant_reasons) + ")"
    if kv_cache_type != "f16":
        return f"no (kv_cache_type {kv_cache_type} turns CPU flash attention on)"
    if gpu_offload:
        return "yes on the CPU (row-invariant build); no for a model on a GPU"
    return "yes (row-invariant build)"


def system_report(extra_bufts_setting: str, kv_cache_type: str = "f16") -> dict:
    """Versions and devices of the loaded llama.cpp build (loads llama.cpp, not a model).

    Returns ``{"llama_cpp_python", "system_info", "gpu_offload", "devices": [{"name", "description", "type",
    "backend", "free", "total"}], "vulkan_visible_devices", "cpu_amx", "build_amx", "extra_bufts", "row_invariant",
    "answer_reuse"}``
    where ``row_invariant`` says whether the CPU computes every row of a batch alike (and if not, why),
    ``gpu_offload`` whether a model offloads layers by default (not to a software Vulkan device alone, which is
    opt-in), ``vulkan_visible_devices`` is the line saying ollapy made a software Vulkan device visible and why it
    is opt-in (None when it did not; :mod:`ollapy.engine.backend.vulkan`) and ``extra_bufts`` is the reason for the choice
    :func:`ollapy.engine.backend.bindings.choose_extra_bufts` makes for ``extra_bufts_setting``
    (``auto``/``on``/``off``), and ``answer_reuse`` the rule :func:`answer_reuse_rule` gives for the default
    ``kv_cache_type``.
    """
    from ollapy.engine.backend import bindings, vulkan

    use, reason = bindings.choose_extra_bufts(extra_bufts_setting)
    bindings.init_backend()  # sets ggml-cpu's tiled-matmul switch unless the environment did
    stock = bindings.patch_marker()[1]  # why the build counts as a stock one ("" when its patch marker matches)
    why = [w for w, on in ((f"tinyBLAS declines one-row products (a stock build{': ' + stock if stock else ''})",
                            bindings.one_row_products_differ()),
                           ("tiled K-quant matmul (GGML_CPU_TILED_MM)", bindings.tiled_matmul_on()),
                           ("weight repacking (extra_bufts)", use)) if on]
    gpu = bindings.supports_gpu_offload()
    return {
        "answer_reuse": answer_reuse_rule(why, gpu, kv_cache_type),
        # on the CPU, every row of a batch is computed alike (engine/speculation.py); a GPU decides per model load
        "row_invariant": "yes on the CPU" if not why else "no: " + ", ".join(why),
        "llama_cpp_python": bindings.library_version(),
        "system_info": bindings.system_info(),
        "gpu_offload": gpu,
        "devices": bindings.devices(),
        "vulkan_visible_devices": vulkan.NOTE,
        "cpu_amx": bindings.cpu_has_amx(),
        "build_amx": bindings.build_has_amx(),
        "extra_bufts": reason,
    }


def rpc_report(endpoints: list[str]) -> dict:
    """``{"supported": bool, "servers": [{"endpoint", "protocol", "devices": [...]} or {"endpoint", "error"}]}``.

    Each endpoint (``host:port``) is checked with the handshake first
    (:func:`ollapy.rpc_endpoint.probe_endpoint`), so an unreachable one is an entry with ``error``, never an
    abort of this process.
    """
    from ollapy.engine.backend import rpc
    from ollapy.errors import RpcUnavailable
    from ollapy.rpc_endpoint import probe_endpoint

    out: dict = {"supported": rpc.supports_rpc(), "servers": []}
    for ep in endpoints:
        entry: dict = {"endpoint": ep}
        if not out["supported"]:
            entry["error"] = "this build has no RPC backend"
        else:
            try:
                entry["protocol"] = ".".join(map(str, probe_endpoint(ep)))
                entry["devices"] = [rpc.describe_device(d) for d in rpc.remote_devices([ep])]
            except RpcUnavailable as exc:
                entry["error"] = str(exc)
        out["servers"].append(entry)
    return out


def rpc_serving_devices(names: list[str]) -> list[int]:
    """The ggml devices an RPC server would serve: those ``names`` (default: every GPU, else the CPU).

    Raises RpcUnavailable when the build has no RPC backend, OllapyError for an unknown device name.
    """
    from ollapy.engine.backend import rpc
    from ollapy.errors import RpcUnavailable

    if not rpc.supports_rpc():
        raise RpcUnavailable("this build of llama.cpp has no RPC backend", rpc._REBUILD)
    return rpc.serving_devices(names or None)


def serve_rpc(endpoint: str, devices: list[int], n_threads: int, cache_dir: str | None) -> None:
    """Run ggml's RPC server on ``endpoint`` (``host:port``) for ``devices`` (from
    :func:`rpc_serving_devices`); returns only when ggml's server stops (it has no stop call)."""
    from ollapy.engine.backend import rpc

    rpc.start_server(endpoint, devices, n_threads, cache_dir)


def quantize_model(src, dst, type_name: str, progress=lambda done, total: None) -> None:
    """Quantize the GGUF ``src`` (F16/F32) into ``dst`` as ``type_name`` with llama.cpp's
    ``llama_model_quantize`` (:func:`ollapy.engine.backend.quantize.quantize_gguf`: ``progress(done, total)``
    counts tensors). A :class:`ollapy.store.adapters.Quantizer`. Raises ModelLoadError when llama.cpp fails."""
    from ollapy.engine.backend.quantize import quantize_gguf

    quantize_gguf(src, dst, type_name, progress)
