"""``ollapy serve``, ``ollapy ps`` and ``ollapy stop``.

``serve`` imports fastapi/uvicorn (and, on the first request, llama.cpp)
only when it runs; ``ps`` and ``stop`` are httpx calls to ``OLLAPY_HOST`` and
say plainly when no server is running.
"""
from __future__ import annotations

import sys
import time

import typer

from .. import config
from ..errors import OllapyError


def serve(
    host: str = typer.Option(None, "--host", help="Address to bind as host:port (default OLLAPY_HOST, 127.0.0.1:11435)."),
    allow_paths: bool = typer.Option(False, "--allow-paths",
                                     help="Accept absolute paths to .gguf files on this machine as model names."),
    option: list[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE",
                                     help="Default model option for every model this server loads (repeatable), e.g. "
                                          "-o rpc=10.0.0.2:50052 or -o num_ctx=8192; a Modelfile's parameters and a "
                                          "request's options override it."),
) -> None:
    """Start the Ollama- and OpenAI-compatible HTTP server (loopback only unless --host/OLLAPY_HOST says otherwise)."""
    import logging

    import uvicorn

    from ..options import parse_options
    from ..server.app import create_app

    defaults = parse_options(option)  # a typo is one line and exit 2 before anything binds
    if host:
        import os

        os.environ["OLLAPY_HOST"] = host
    h, port = config.host_port()
    logging.basicConfig(level=logging.DEBUG if config.debug() else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = bind_listener(h, port)  # before any "listening" line: a taken port is one error line, exit 1
    if h not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {h}:{port}, reachable from other machines", file=sys.stderr)
    print(f"ollapy serve listening on http://{h}:{port}", file=sys.stderr)
    # uvicorn shuts down gracefully on SIGTERM (the lifespan closes every model: engine joined, prompt cache saved,
    # model freed), then raises the signal again; with this handler that ends as exit code 0, not death by signal
    import signal

    def _terminated(signum, frame):
        raise typer.Exit(0)

    previous = signal.signal(signal.SIGTERM, _terminated)
    server = uvicorn.Server(uvicorn.Config(create_app(allow_paths=allow_paths, defaults=defaults), host=h, port=port,
                                           log_level="debug" if config.debug() else "warning",
                                           timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C: uvicorn already shut down gracefully
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        print("ollapy serve stopped", file=sys.stderr)
    if not server.started:
        raise OllapyError(f"server on {h}:{port} failed to start", hint="set OLLAPY_DEBUG=1 to see why")


def bind_listener(host: str, port: int):
    """A TCP socket bound to ``host:port`` (IPv6 when ``host`` has a colon) for uvicorn to listen on.

    Binding here, before anything is printed, turns a taken port into one
    OllapyError line (exit 1) naming the address and the cause, instead of
    uvicorn's log line and exit 3.
    """
    import errno
    import os
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses TIME_WAIT ports
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        cause = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        if exc.errno == errno.EADDRINUSE:
            hint = "stop the server using it, or pick another port with --host HOST:PORT or OLLAPY_HOST"
        else:
            hint = "pick another address with --host HOST:PORT or OLLAPY_HOST"
        raise OllapyError(f"cannot listen on {shown}: {cause}", hint=hint) from None
    return sock


def _until(expires: str | None) -> str:
    if not expires or expires.startswith("2318") or expires.startswith("0001"):
        return "Forever"
    import datetime

    try:
        t = datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return expires
    d = t - time.time()
    if d <= 0:
        return "Stopping..."
    for unit, sec in (("hour", 3600), ("minute", 60), ("second", 1)):
        if d >= sec:
            n = int(d // sec)
            return f"{n} {unit}{'s' if n != 1 else ''} from now"
    return "Less than a second from now"


def ps() -> None:
    """List the models a running server has loaded (NAME ID SIZE PROCESSOR CONTEXT SLOTS KV/SLOT UNTIL)."""
    from ..client import Client
    from ..store.progress import human_size

    client = Client(timeout=10)
    models = client.ps()
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "KV/SLOT", "UNTIL")]
    for m in models:
        size = int(m.get("size") or 0)
        vram = int(m.get("size_vram") or 0)
        rpc = [ep for ep in (m.get("rpc") or "").split(",") if ep]
        if rpc:  # layers on RPC servers' devices (num_gpu and tensor_split decide how many)
            proc = f"RPC ({len(rpc)} server{'s' if len(rpc) != 1 else ''})"
        elif size and vram >= size:
            proc = "100% GPU"
        elif vram:
            pct = round(100 * vram / size)
            proc = f"{100 - pct}%/{pct}% CPU/GPU"
        else:
            proc = "100% CPU"
        slots = f"{m.get('slots_busy', 0)}/{m.get('num_parallel', '?')}"
        if m.get("stale"):  # its runner has not refreshed its figures lately (stopped or hung): they are old
            slots += f" (stale {float(m.get('stats_age_s') or 0):.0f}s)"
        kv = int(m.get("kv_bytes_per_slot") or 0)
        kv_text = f"{human_size(kv)} {m.get('kv_cache_type') or ''}".strip() if kv else "-"
        rows.append((m.get("name", ""), (m.get("digest") or "")[:12] or "-", human_size(size), proc,
                     str(m.get("context_length", "")), slots, kv_text, _until(m.get("expires_at"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def stop(model: str = typer.Argument(..., help="Model to unload from the running server.")) -> None:
    """Unload a model from the running server."""
    from ..client import Client

    client = Client(timeout=30)
    loaded = {m.get("name") for m in client.ps()} | {m.get("model") for m in client.ps()}
    if model not in loaded and f"{model}:latest" not in loaded:
        raise OllapyError(f"model {model!r} is not loaded on the server at {client.host}", hint="see `ollapy ps`")
    client.stop(model if model in loaded else f"{model}:latest")


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``ps`` and ``stop``."""
    app.command("serve")(serve)
    app.command("ps")(ps)
    app.command("stop")(stop)
