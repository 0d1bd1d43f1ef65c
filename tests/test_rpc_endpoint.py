"""The RPC pre-flight handshake against stand-in servers, and the rpc/tensor_split option and setting values.

No llama.cpp here: the point of the pre-flight check is that it runs before any ggml call (whose client
aborts the process on a failed connection).
"""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from ollapy.errors import OptionError, RpcUnavailable, SettingError
from ollapy.options import coerce_option, tensor_split_values
from ollapy.rpc_endpoint import RPC_CMD_HELLO, check_endpoints, parse_endpoints, probe_endpoint


class FakeServer:
    """A loopback TCP server that answers the first message with ``reply(request_bytes)``."""

    def __init__(self, reply) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.request = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            self.request = conn.recv(33)
            out = self.reply(self.request)
            if out is not None:
                try:
                    conn.sendall(out)
                    conn.recv(1)  # until the client closes
                except OSError:  # the client may reset a connection it is done with
                    pass

    def close(self) -> None:
        self.sock.close()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def hello_reply(major: int, minor: int, patch: int = 0) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def test_probe_sends_the_hello_of_ggml_rpc_and_reads_the_version():
    srv = FakeServer(lambda req: hello_reply(7, 0, 3))
    try:
        assert probe_endpoint(srv.endpoint) == (7, 0, 3)
        assert srv.request == struct.pack("<BQ", RPC_CMD_HELLO, 24) + bytes(24)
    finally:
        srv.close()


@pytest.mark.parametrize("reply, words", [
    (hello_reply(6, 0), "speaks protocol 6.0.0"),
    (hello_reply(7, 1), "speaks protocol 7.1.0"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "answered the handshake with"),
])
def test_incompatible_servers_are_one_line_naming_the_endpoint(reply, words):
    srv = FakeServer(lambda req: reply)
    try:
        with pytest.raises(RpcUnavailable) as err:
            probe_endpoint(srv.endpoint)
        assert words in str(err.value) and srv.endpoint in str(err.value) and "\n" not in str(err.value)
        assert err.value.endpoint == srv.endpoint
    finally:
        srv.close()


def test_a_server_that_closes_or_never_answers_is_unavailable():
    closing = FakeServer(lambda req: None)
    try:
        with pytest.raises(RpcUnavailable, match="unreachable"):
            probe_endpoint(closing.endpoint)
    finally:
        closing.close()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts into the backlog, never answers: the handshake waits, then says so
    try:
        with pytest.raises(RpcUnavailable, match="did not answer within 0.5 s"):
            probe_endpoint(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    finally:
        silent.close()


def test_a_refused_endpoint_says_how_to_start_a_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RpcUnavailable) as err:
        check_endpoints([f"127.0.0.1:{port}"])
    assert "refused" in str(err.value) and "ollapy rpc-server" in err.value.hint


def test_endpoint_lists_are_normalized_and_bad_ones_rejected(monkeypatch):
    assert parse_endpoints(" 10.0.0.2:50052, localhost:1,10.0.0.2:50052 ") == ("10.0.0.2:50052", "localhost:1")
    assert parse_endpoints("[::1]:50052") == ("[::1]:50052",)
    assert parse_endpoints("") == ()
    for bad in ("host", "host:", ":50052", "host:0", "host:70000", "host:port"):
        with pytest.raises(OptionError, match="is not HOST:PORT"):
            parse_endpoints(bad)
    with pytest.raises(OptionError, match="at most 16"):
        parse_endpoints(",".join(f"h:{p}" for p in range(1, 18)))
    assert coerce_option("rpc", "a:1,b:2") == "a:1,b:2"
    from ollapy import config

    monkeypatch.setenv("OLLAPY_RPC", "a:1, b:2")
    assert config.rpc() == "a:1,b:2"
    monkeypatch.setenv("OLLAPY_RPC", "a")
    with pytest.raises(SettingError, match="OLLAPY_RPC='a' is not valid"):
        config.rpc()


def test_tensor_split_takes_proportions():
    assert coerce_option("tensor_split", "3, 1") == "3,1"
    assert tensor_split_values("3,1") == [3.0, 1.0]
    assert tensor_split_values("") == []
    for bad in ("a,b", "-1,2", "0,0"):
        with pytest.raises(OptionError, match="tensor_split"):
            coerce_option("tensor_split", bad)


def test_a_request_cannot_point_the_server_at_rpc_hosts():
    from ollapy.options import api_options

    with pytest.raises(OptionError, match="option rpc cannot be set by a request") as err:
        api_options({"rpc": "10.0.0.9:50052"})
    assert "serve -o rpc=" in err.value.hint
    assert api_options({"tensor_split": "1,1", "num_gpu": 4}) == {"tensor_split": "1,1", "num_gpu": 4}
