"""``ollapy rpc-server``: serve this machine's ggml backend (CPU or GPUs) to other hosts over llama.cpp's RPC.

The server is ggml's own (``ggml_backend_rpc_start_server``, reached through :mod:`ollapy.engine.system`); clients are
``ollapy run/serve -o rpc=HOST:PORT`` (or llama.cpp's ``--rpc``) of the same llama.cpp version. ggml serves one
client connection at a time. The protocol has no authentication or encryption: it binds loopback by
default, and any other address gets a one-line warning.

Ctrl-C (or SIGTERM) stops it: ggml has no stop call, so the server runs on a thread and the process exits
once the signal arrives (nothing is written that could be left half done).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading

import typer

from ollapy.errors import OllapyError


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port(host: str, port: int) -> None:
    """Bind and release ``host:port`` first, so a taken port is one clear line (ggml would print its own)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise OllapyError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         hint="pick another --port, or stop what uses it") from None


def rpc_server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(50052, "--port", "-p", min=1, max=65535, help="TCP port."),
    threads: int = typer.Option(0, "--threads", "-t", min=0,
                                help="CPU threads for the CPU device (0 = every CPU up to 4, half above)."),
    cache: str = typer.Option("", "--cache", metavar="DIR",
                              help="ggml's tensor cache directory: large weights are sent once, by hash."),
    device: list[str] = typer.Option([], "--device", "-d",
                                     help="ggml device to serve (repeatable, e.g. CUDA0); default: every GPU, "
                                          "else the CPU. `ollapy info` lists them."),
) -> None:
    """Serve this machine's CPU or GPUs to other hosts over llama.cpp's RPC backend (no authentication:
    trusted networks only)."""
    from ollapy.engine import system
    from ollapy.engine.cpuload import default_threads

    names = [n.strip() for d in device for n in d.split(",") if n.strip()]
    devs = system.rpc_serving_devices(names)
    if not _is_loopback(host):
        print(f"warning: the RPC protocol has no authentication or encryption; anyone who reaches {host}:{port} "
              "can use this machine's devices: trusted networks only", file=sys.stderr)
    _check_port(host, port)
    if cache:
        os.makedirs(cache, exist_ok=True)
    n_threads = threads or default_threads()  # this process's own CPUs (affinity, cgroup quota)
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    done = threading.Event()

    def serve() -> None:
        try:
            system.serve_rpc(endpoint, devs, n_threads, cache or None)
        finally:
            done.set()

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    worker = threading.Thread(target=serve, name="ollapy-rpc-server", daemon=True)
    worker.start()
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("rpc-server stopped", file=sys.stderr)
        return
    raise OllapyError(f"rpc-server on {endpoint} stopped: ggml could not serve there",
                      hint="run with OLLAPY_DEBUG=1, or check the address")


def register(app: typer.Typer) -> None:
    """Add ``rpc-server`` to the app."""
    app.command("rpc-server")(rpc_server)
