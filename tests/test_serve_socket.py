"""The listening socket of ``ollapy serve``: responses on a kept-alive connection are not held back by Nagle.

A listener made as ``socket.socket(AF_INET)`` has ``proto`` 0, so asyncio never set ``TCP_NODELAY`` on the
connections it accepted: each response's second write waited for the client's delayed ACK, 40 ms on every request
after the first on a kept-alive connection (every keystroke of an editor's code completion).
"""
import socket
import statistics
import time

import httpx
from conftest import live_server

from ollapy.cli.serve_cmd import bind_listener


def test_the_listener_names_tcp_and_sets_nodelay():
    sock = bind_listener("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


def test_kept_alive_requests_are_answered_without_the_delayed_ack_wait(tmp_path):
    with live_server(tmp_path) as url, httpx.Client(base_url=url) as client:
        client.get("/api/version")
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            assert client.get("/api/version").status_code == 200
            times.append(time.perf_counter() - t0)
    # 40 ms (Linux's delayed ACK) is the Nagle signature; a loopback request takes 1-3 ms, under load a few more
    assert statistics.median(times) < 0.02, [round(t * 1000, 1) for t in times]
