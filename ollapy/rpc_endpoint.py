"""RPC server endpoints: parsing ``HOST:PORT[,HOST:PORT…]`` and the pre-flight handshake.

llama.cpp's RPC client (``ggml-rpc.cpp``) aborts the whole process (``GGML_ABORT`` via ``RPC_STATUS_ASSERT``)
when it cannot connect or the handshake fails; a Python ``try`` cannot catch that. So before any ggml call
touches an endpoint, :func:`check_endpoints` connects to each one from Python and completes the same
``RPC_CMD_HELLO`` exchange the client does, then closes the connection (the server goes back to ``accept``):

* request: ``cmd`` (1 byte, 14 = ``RPC_CMD_HELLO``) | ``size`` (uint64 LE, 24) | ``conn_caps`` (24 zero bytes:
  plain TCP, no transport upgrade);
* response: ``size`` (uint64 LE, 28) | ``major`` ``minor`` ``patch`` ``pad`` (1 byte each) | ``conn_caps`` (24).

The versions must match as the client demands: same major, server minor not above the client's
(``RPC_PROTO_MAJOR_VERSION`` 7, minor 0 in the llama.cpp of llama-cpp-python 0.3.36, ``ggml/include/ggml-rpc.h``).

A ggml RPC server serves one client connection at a time: while another process holds it, the handshake
waits; after ``timeout`` seconds that is reported as busy. Nothing here imports llama_cpp.
"""
from __future__ import annotations

import socket
import struct

from ollapy.errors import OptionError, RpcUnavailable

RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
PROTO_MAJOR = 7
PROTO_MINOR = 0
DEFAULT_PORT = 50052
_HINT = "start it with `ollapy rpc-server` on that host (or llama.cpp's rpc-server), or fix the rpc setting"


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> ``(host, port)``; raises OptionError naming the bad text."""
    t = text.strip()
    host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"rpc endpoint {t!r} is not HOST:PORT", hint="e.g. -o rpc=192.168.1.10:50052")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_endpoints(text: str) -> tuple[str, ...]:
    """Comma-separated endpoints -> normalized ``("host:port", …)`` in order, duplicates dropped.

    Empty text -> ``()``. Raises OptionError for a malformed item or more than 16 (``GGML_RPC_MAX_SERVERS``).
    """
    out: list[str] = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        host, port = parse_endpoint(item)
        ep = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        if ep not in out:
            out.append(ep)
    if len(out) > 16:
        raise OptionError(f"rpc lists {len(out)} servers; llama.cpp takes at most 16")
    return tuple(out)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("connection closed during the handshake")
        buf += part
    return bytes(buf)


def probe_endpoint(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """Complete the RPC handshake with ``endpoint``; return the server's protocol ``(major, minor, patch)``.

    Raises RpcUnavailable (one line naming the endpoint) when it refuses or times out (``timeout`` seconds
    for connect and answer each), answers something that is not an RPC hello, or speaks an incompatible
    protocol version.
    """
    host, port = parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
            if size != 4 + RPC_CONN_CAPS_SIZE:
                raise RpcUnavailable(f"RPC server {endpoint} answered the handshake with {size} bytes, not 28",
                                     "it speaks another RPC protocol version; run the same llama.cpp version on "
                                     "both ends", endpoint=endpoint)
            major, minor, patch, _pad = _recv_exact(sock, 4)
            _recv_exact(sock, RPC_CONN_CAPS_SIZE)
    except RpcUnavailable:
        raise
    except TimeoutError:
        raise RpcUnavailable(f"RPC server {endpoint} did not answer within {timeout:g} s",
                             "it may be serving another client (one at a time) or not be an RPC server",
                             endpoint=endpoint) from None
    except ConnectionRefusedError:
        raise RpcUnavailable(f"RPC server {endpoint} refused the connection", _HINT, endpoint=endpoint) from None
    except (OSError, ConnectionError) as exc:
        raise RpcUnavailable(f"RPC server {endpoint} is unreachable: {exc.strerror or exc}", _HINT,
                             endpoint=endpoint) from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise RpcUnavailable(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, ollapy's llama.cpp "
                             f"speaks {PROTO_MAJOR}.{PROTO_MINOR}", "run the same llama.cpp version on both ends",
                             endpoint=endpoint)
    return major, minor, patch


def unreachable_endpoints(endpoints: tuple[str, ...] | list[str], timeout: float = 2.0) -> list[str]:
    """The endpoints, in order, whose handshake fails now (:func:`probe_endpoint`, ``timeout`` seconds each);
    ``[]`` when all answer. Used to name the lost host after a runner on RPC servers stopped."""
    down = []
    for ep in endpoints:
        try:
            probe_endpoint(ep, timeout)
        except RpcUnavailable:
            down.append(ep)
    return down


def check_endpoints(endpoints: tuple[str, ...] | list[str], timeout: float = 5.0) -> None:
    """:func:`probe_endpoint` each endpoint in order; raises RpcUnavailable for the first that fails."""
    for ep in endpoints:
        probe_endpoint(ep, timeout)
