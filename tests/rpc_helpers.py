"""Test helpers for llama.cpp's RPC backend: `ollapy rpc-server` processes on loopback standing in for hosts."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """One `ollapy rpc-server` child process on ``127.0.0.1:port``; :meth:`start`, :meth:`kill`, :meth:`stop`."""

    def __init__(self, port: int | None = None, threads: int = 1, devices: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.threads = threads
        self.devices = devices or []  # ggml device names to serve (`--device`); default: the server's rule
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RpcServer:
        """Start it and wait for the event that it completes a handshake (bounded only against hangs)."""
        from ollapy.errors import RpcUnavailable
        from ollapy.rpc_endpoint import probe_endpoint

        env = dict(os.environ)
        env.pop("OLLAPY_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "rpc-server", "--port", str(self.port),
                                      "--threads", str(self.threads),
                                      *(a for d in self.devices for a in ("--device", d))], env=env, cwd=str(ROOT),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while True:
            try:
                probe_endpoint(self.endpoint, timeout=5)
                return self
            except RpcUnavailable:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rpc-server exited with {self.proc.returncode}: "
                                       f"{self.proc.stderr.read().decode(errors='replace')}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL it (a host lost mid-request) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def stop(self) -> int:
        """Ctrl-C (SIGINT); returns its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)


@contextlib.contextmanager
def rpc_servers(n: int = 2):
    """``n`` running rpc-servers; killed on exit."""
    servers = [RpcServer() for _ in range(n)]
    try:
        for s in servers:
            s.start()
        yield servers
    finally:
        for s in servers:
            s.kill()
