"""``ollapy info``: versions, llama.cpp system info, ggml devices, GPU offload and the CPU safety choice."""
from __future__ import annotations

import json
import platform
import sys

import typer

from ollapy import __version__, config


def collect_rpc(endpoints: str) -> dict:
    """``{"supported": bool, "servers": [{"endpoint", "devices": [...]}, ...]}`` for ``info``.

    ``endpoints``: the ``rpc`` setting (``host:port,…``); see :func:`ollapy.engine.system.rpc_report` (an
    unreachable server is an entry with ``error``, never an abort).
    """
    from ollapy.engine.system import rpc_report
    from ollapy.rpc_endpoint import parse_endpoints

    return rpc_report(list(parse_endpoints(endpoints)))


def collect_info(rpc_endpoints: str = "") -> dict:
    """Everything ``info`` prints, as a dict (loads llama.cpp, not a model); ``rpc_endpoints`` as in
    :func:`collect_rpc`."""
    from ollapy.engine.system import system_report

    report = system_report(config.extra_bufts(), config.kv_cache_type())
    return {
        "ollapy": __version__,
        "llama_cpp_python": report["llama_cpp_python"],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "system_info": report["system_info"],
        "gpu_offload": report["gpu_offload"],
        "devices": report["devices"],
        "vulkan_visible_devices": report["vulkan_visible_devices"],  # None unless ollapy exposed a software device
        "cpu_amx": report["cpu_amx"],
        "build_amx": report["build_amx"],
        "extra_bufts": report["extra_bufts"],
        "row_invariant": report["row_invariant"],
        "answer_reuse": report["answer_reuse"],
        "paths": {
            "models": str(config.models_dir()),
            "prompt_cache": str(config.cache_dir()),
            "state": str(config.state_dir()),
        },
        "host": config.host(),
        "cache_remote": _remote_line(),
        "rpc": collect_rpc(rpc_endpoints),
    }


def _remote_line() -> str | None:
    """The prompt cache's remote tier as ``info`` shows it: the URL with its password redacted, the namespace."""
    from ollapy.cache.remote import redact

    url = config.cache_remote()
    return f"{redact(url)} (namespace {config.CACHE_NAMESPACE.raw()})" if url else None


def _fmt_mem(d: dict) -> str:
    return f"{d['free'] / 2**30:.1f}/{d['total'] / 2**30:.1f} GiB free" if d["total"] else ""


def _offload_line(data: dict) -> str:
    if data["gpu_offload"]:
        return "yes"
    if data["vulkan_visible_devices"]:
        return "no by default: the only GPU is a software Vulkan device (see vulkan:), used with -o num_gpu=N"
    return "no (no GPU device in this build)"


def info(
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
    rpc: str = typer.Option("", "--rpc", metavar="HOST:PORT[,HOST:PORT...]",
                            help="RPC servers to list with their devices (default: OLLAPY_RPC)."),
) -> None:
    """Show versions, backends (CPU/CUDA/Metal/Vulkan devices, RPC), the CPU safety choice and paths."""
    from ollapy.options import coerce_option

    data = collect_info(coerce_option("rpc", rpc) if rpc else config.rpc())
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    lines = [
        f"ollapy:            {data['ollapy']}",
        f"llama-cpp-python:  {data['llama_cpp_python']}",
        f"python:            {data['python']} ({data['platform']})",
        f"gpu offload:       {_offload_line(data)}",
        f"extra buffers:     {data['extra_bufts']}",
        f"row-invariant:     {data['row_invariant']}",
        f"answer reuse:      {data['answer_reuse']}",
        f"cpu amx / build:   {data['cpu_amx']} / {data['build_amx']}",
        "devices:",
    ]
    for d in data["devices"]:
        lines.append(f"  {d['name']:<10} {d['description']}  {d['type']}  {_fmt_mem(d)}".rstrip())
    if data["vulkan_visible_devices"]:
        lines.append(f"vulkan:            {data['vulkan_visible_devices']}")
    rpc_info = data["rpc"]
    lines.append(f"rpc:               {'yes' if rpc_info['supported'] else 'no (build without -DGGML_RPC=ON)'}")
    for srv in rpc_info["servers"]:
        if "error" in srv:
            lines.append(f"  {srv['endpoint']}  error: {srv['error']}")
        for d in srv.get("devices", []):
            lines.append(f"  {srv['endpoint']}  {d['name']:<6} {_fmt_mem(d)}".rstrip())
    lines += [
        f"system info:       {data['system_info']}",
        f"models dir:        {data['paths']['models']}",
        f"prompt cache dir:  {data['paths']['prompt_cache']}",
        f"state dir:         {data['paths']['state']}",
        f"server address:    {data['host']}",
    ]
    if data.get("cache_remote"):
        lines.append(f"cache remote tier: {data['cache_remote']}")
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    """Add ``info`` to the app."""
    app.command("info")(info)
