"""``ollapy info``: versions, llama.cpp system info, ggml devices, GPU offload and the CPU safety choice."""
from __future__ import annotations

import json
import platform
import sys

import typer

from .. import __version__, config


def collect_info() -> dict:
    """Everything ``info`` prints, as a dict (loads llama.cpp, not a model)."""
    from ..engine import bindings as backend

    use, reason = backend.choose_extra_bufts(config.extra_bufts())
    return {
        "ollapy": __version__,
        "llama_cpp_python": backend.library_version(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "system_info": backend.system_info(),
        "gpu_offload": backend.supports_gpu_offload(),
        "devices": backend.devices(),
        "cpu_amx": backend.cpu_has_amx(),
        "build_amx": backend.build_has_amx(),
        "extra_bufts": reason,
        "paths": {
            "models": str(config.models_dir()),
            "prompt_cache": str(config.cache_dir()),
            "state": str(config.state_dir()),
        },
        "host": config.host(),
    }


def info(as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """Show versions, backends (CPU/CUDA/Metal/Vulkan devices), the CPU safety choice and paths."""
    data = collect_info()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    lines = [
        f"ollapy:            {data['ollapy']}",
        f"llama-cpp-python:  {data['llama_cpp_python']}",
        f"python:            {data['python']} ({data['platform']})",
        f"gpu offload:       {'yes' if data['gpu_offload'] else 'no (CPU build)'}",
        f"extra buffers:     {data['extra_bufts']}",
        f"cpu amx / build:   {data['cpu_amx']} / {data['build_amx']}",
        "devices:",
    ]
    for d in data["devices"]:
        mem = f"{d['free'] / 2**30:.1f}/{d['total'] / 2**30:.1f} GiB free" if d["total"] else ""
        lines.append(f"  {d['name']:<10} {d['description']}  {mem}".rstrip())
    lines += [
        f"system info:       {data['system_info']}",
        f"models dir:        {data['paths']['models']}",
        f"prompt cache dir:  {data['paths']['prompt_cache']}",
        f"state dir:         {data['paths']['state']}",
        f"server address:    {data['host']}",
    ]
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    """Add ``info`` to the app."""
    app.command("info")(info)
