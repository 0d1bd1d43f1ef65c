"""``ollapy serve``, ``ollapy ps`` and ``ollapy stop``.

``serve`` imports fastapi/uvicorn (and, on the first request, llama.cpp)
only when it runs; ``ps`` and ``stop`` are httpx calls to ``OLLAPY_HOST`` and
say plainly when no server is running.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from ollapy import config
from ollapy.errors import OllapyError, UsageError


def serve(
    host: str = typer.Option(None, "--host", help="Address to bind as host:port (default OLLAPY_HOST, 127.0.0.1:11435)."),
    allow_paths: bool = typer.Option(False, "--allow-paths",
                                     help="Accept absolute paths to .gguf files on this machine as model names."),
    option: list[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE",
                                     help="Default model option for every model this server loads (repeatable), e.g. "
                                          "-o rpc=10.0.0.2:50052 or -o num_ctx=8192; a Modelfile's parameters and a "
                                          "request's options override it."),
    api_key: str = typer.Option(None, "--api-key", metavar="KEY",
                                help="Require this key (Authorization: Bearer KEY or x-api-key: KEY) on every route "
                                     "but GET / (default OLLAPY_API_KEY). Other users see it in `ps`: prefer "
                                     "--api-key-file."),
    api_key_file: Path = typer.Option(None, "--api-key-file", metavar="PATH",
                                      help="Read the API key from the first line of this file."),
    no_webui: bool = typer.Option(False, "--no-webui",
                                  help="Do not show the chat page to browsers at / (default OLLAPY_NO_WEBUI)."),
) -> None:
    """Start the Ollama- and OpenAI-compatible HTTP server (loopback only unless --host/OLLAPY_HOST says otherwise)."""
    import logging

    import uvicorn

    from ollapy.options import parse_options
    from ollapy.server.app import create_app

    defaults = parse_options(option)  # a typo is one line and exit 2 before anything binds
    key = read_api_key(api_key, api_key_file)
    h, port = host_port_of(host)
    logging.basicConfig(level=logging.DEBUG if config.debug() else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # before any "listening" line: a taken port is one error line, exit 1
    sock = bind_listener(h, port, source="--host" if host else "OLLAPY_HOST")
    if h not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {h}:{port}, reachable from other machines"
              + ("" if key else " with no API key (set OLLAPY_API_KEY or --api-key-file)"), file=sys.stderr)
    print(f"ollapy serve listening on http://{h}:{port}" + (" (API key required)" if key else ""), file=sys.stderr)
    webui = not no_webui and not config.no_webui()
    if webui:
        print(f"chat page: {chat_page_url(h, sock.getsockname()[1])} (open in a browser)", file=sys.stderr)
    # uvicorn shuts down gracefully on SIGTERM (the lifespan closes every model: engine joined, prompt cache saved,
    # model freed), then raises the signal again; with this handler that ends as exit code 0, not death by signal
    import signal

    def _terminated(signum, frame):
        raise typer.Exit(0)

    previous = signal.signal(signal.SIGTERM, _terminated)
    from ollapy.server import generation

    class Server(uvicorn.Server):
        """uvicorn's server whose first exit signal also cancels the running generations: their streams end
        with an error line at once, instead of being cut (with a traceback) when the graceful wait runs out."""

        def handle_exit(self, sig, frame) -> None:
            generation.cancel_all()
            super().handle_exit(sig, frame)

    app = create_app(allow_paths=allow_paths, defaults=defaults, api_key=key, bind=h, webui=webui)
    server = Server(uvicorn.Config(app, host=h, port=port, log_level="debug" if config.debug() else "warning",
                                   timeout_graceful_shutdown=5, access_log=False))  # ollapy.access logs requests
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


def chat_page_url(host: str, port: int) -> str:
    """The address a browser on this machine opens for the chat page of a server listening on ``host:port``: a
    wildcard address (``0.0.0.0``, ``::``) as the loopback address of its family, an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def read_api_key(api_key: str | None, api_key_file: Path | None) -> str:
    """The key ``serve`` requires: ``--api-key``, the first line of ``--api-key-file``, else ``OLLAPY_API_KEY``
    (``""`` = none). Raises UsageError (both flags, an unreadable or empty file, a key with blanks inside)."""
    import os

    if api_key is not None and api_key_file is not None:
        raise UsageError("--api-key and --api-key-file are exclusive", hint="give one of them")
    if api_key_file is not None:
        try:
            lines = api_key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--api-key-file {api_key_file}: cannot read it ({type(exc).__name__})") from None
        api_key = lines[0].strip() if lines else ""
        if not api_key:
            raise UsageError(f"--api-key-file {api_key_file} is empty", hint="write the key on its first line")
    if api_key is None:
        return config.api_key()
    old = os.environ.get("OLLAPY_API_KEY")
    os.environ["OLLAPY_API_KEY"] = api_key  # checked like the variable (printable, no blanks), never echoed
    try:
        return config.api_key()
    except UsageError:
        raise UsageError("the API key must be printable ASCII without blanks",
                         hint="e.g. the output of `openssl rand -hex 32`") from None
    finally:
        if old is None:
            os.environ.pop("OLLAPY_API_KEY", None)
        else:
            os.environ["OLLAPY_API_KEY"] = old


def host_port_of(host: str | None) -> tuple[str, int]:
    """``(host, port)`` to bind: ``--host`` when given, else ``OLLAPY_HOST``. A bad ``--host`` is a UsageError
    naming ``--host`` (not the variable it stands in for)."""
    import os

    if not host:
        return config.host_port()
    old = os.environ.get("OLLAPY_HOST")
    os.environ["OLLAPY_HOST"] = host
    try:
        return config.host_port()
    except UsageError as exc:
        expected = getattr(exc, "expected", "host:port, e.g. 127.0.0.1:11435")
        raise UsageError(f"--host {host!r} is not valid: expected {expected}",
                         hint="e.g. --host 127.0.0.1:11435 or --host 0.0.0.0:11435") from None
    finally:  # the CLI's client side keeps reading the variable the user set
        if old is None:
            os.environ.pop("OLLAPY_HOST", None)
        else:
            os.environ["OLLAPY_HOST"] = old


def bind_listener(host: str, port: int, source: str = "OLLAPY_HOST"):
    """A TCP socket bound to ``host:port`` (IPv6 when ``host`` has a colon) for uvicorn to listen on, with
    ``TCP_NODELAY`` for the connections it accepts.

    Binding here, before anything is printed, turns a taken port or a host
    name that does not resolve into one OllapyError line (exit 1) naming the
    address, the cause and ``source`` (``--host`` or ``OLLAPY_HOST``), instead
    of uvicorn's log line and exit 3.
    """
    import errno
    import os
    import socket

    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and an accepted
    # socket inherits the listener's. Without it Nagle holds each response's second write until the client's
    # delayed ACK: +40 ms on every request of a kept-alive connection (an editor's every keystroke).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses TIME_WAIT ports
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets on Linux and macOS
    try:
        sock.bind((host, port))
    except socket.gaierror:  # a name that does not resolve: errno is getaddrinfo's (-2), not an OS errno
        sock.close()
        raise OllapyError(f"cannot listen on {shown}: {source} names no address of this machine",
                          hint="give an IP address or a name that resolves to one, e.g. "
                               + ("--host 127.0.0.1:11435" if source == "--host" else "OLLAPY_HOST=127.0.0.1:11435")
                          ) from None
    except OSError as exc:
        sock.close()
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
    """List the models a running server has loaded (NAME ID SIZE PROCESSOR CONTEXT SLOTS KV/SLOT DRAFT UNTIL)."""
    from ollapy.cli.client import Client
    from ollapy.store.progress import human_size

    client = Client(timeout=10)
    models = client.ps()
    rows = [("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "KV/SLOT", "DRAFT", "UNTIL")]
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
                     str(m.get("context_length", "")), slots, kv_text, _draft_text(m), _until(m.get("expires_at"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _draft_text(m: dict) -> str:
    """The DRAFT column: how the model drafts (its draft model, ``ngram``, or ``request`` when only requests asked
    for it) and the share of drafted tokens accepted so far; ``-`` when it has not drafted."""
    n, k = int(m.get("draft_tokens") or 0), int(m.get("draft_accepted") or 0)
    how = m.get("draft") or ("request" if n else "")
    if not how:
        return "-"
    return f"{how} {k / n:.0%}" if n else how


def stop(model: str = typer.Argument(..., help="Model to unload from the running server.")) -> None:
    """Unload a model from the running server."""
    from ollapy.cli.client import Client

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
