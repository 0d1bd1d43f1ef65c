"""A loopback-only Ollama registry (v2 API) for tests, on the standard library.

``GET /v2/<ns>/<model>/manifests/<tag>`` returns a Docker v2 manifest;
``GET /v2/<ns>/<model>/blobs/sha256:<hex>`` returns the bytes, honouring
``Range``. Counters (``bytes_served``, ``ranges``) and injectable faults
(``faults[hex] = ["500", "truncate:N", "empty", "corrupt", "404", "norange", "slow", "gzip"]``,
consumed one per request; ``faults["manifest"] = ["altered"]`` serves the next
manifest as other bytes) let tests prove resume and retry behaviour. Manifests
are also served by digest (``manifests/sha256:<hex>``).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from quiet_http import QuietHTTPServer

MT = "application/vnd.ollama.image."


def sha256_path(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


class FakeRegistry:
    """Serve models on ``http://127.0.0.1:<port>``; use as a context manager."""

    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str, str], dict] = {}
        self.blobs: dict[str, Path | bytes] = {}
        self.faults: dict[str, list[str]] = defaultdict(list)
        self.bytes_served: dict[str, int] = defaultdict(int)
        self.ranges: dict[str, list[str | None]] = defaultdict(list)
        self.accept_encodings: dict[str, list[str | None]] = defaultdict(list)
        self.throttle: float = 0.0  # seconds slept per 1 MiB sent
        self.rate: float = 0.0  # when > 0: bytes per second per response (paced like a network link)
        self.cache: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.server = QuietHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add_blob(self, data: Path | bytes, digest: str | None = None) -> dict:
        """Register bytes (or a file); return the layer descriptor without mediaType."""
        if isinstance(data, Path):
            hexd, size = digest or sha256_path(data), data.stat().st_size
        else:
            hexd, size = digest or hashlib.sha256(data).hexdigest(), len(data)
        self.blobs[hexd] = data
        return {"digest": f"sha256:{hexd}", "size": size}

    def add_model(self, ns: str, model: str, tag: str, gguf: Path | bytes, *, template: str | None = None,
                  params: dict | None = None, system: str | None = None, license: str | None = None,
                  gguf_digest: str | None = None) -> dict:
        """Publish a model; return its manifest."""
        layers = [{"mediaType": MT + "model", **self.add_blob(gguf, gguf_digest)}]
        for kind, value in (("template", template), ("system", system), ("license", license)):
            if value is not None:
                layers.append({"mediaType": MT + kind, **self.add_blob(value.encode())})
        if params is not None:
            layers.append({"mediaType": MT + "params", **self.add_blob(json.dumps(params).encode())})
        config = {"mediaType": "application/vnd.docker.container.image.v1+json",
                  **self.add_blob(json.dumps({"model_format": "gguf"}).encode())}
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": config, "layers": layers}
        self.manifests[(ns, model, tag)] = manifest
        return manifest

    def __enter__(self) -> FakeRegistry:  # noqa: PYI034 - typing.Self needs 3.11
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        reg = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) == 5 and parts[0] == "v2" and parts[3] == "manifests":
                    ref = parts[4]
                    if ref.startswith("sha256:"):  # by digest: the sha256 of the manifest bytes as served
                        m = next((v for (ns, mo, _), v in reg.manifests.items() if (ns, mo) == (parts[1], parts[2])
                                  and hashlib.sha256(json.dumps(v).encode()).hexdigest() == ref[7:]), None)
                    else:
                        m = reg.manifests.get((parts[1], parts[2], ref))
                    if m is None:
                        return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    body = json.dumps(m).encode()
                    with reg.lock:
                        if reg.faults["manifest"] and reg.faults["manifest"].pop(0) == "altered":
                            body = json.dumps(m, indent=1).encode()  # same JSON value, other bytes
                    return self._send(200, body, "application/vnd.docker.distribution.manifest.v2+json")
                if len(parts) == 5 and parts[0] == "v2" and parts[3] == "blobs":
                    return self._blob(parts[4].removeprefix("sha256:"))
                self._send(404, b"{}")

            def _blob(self, hexd: str) -> None:
                src = reg.blobs.get(hexd)
                with reg.lock:
                    fault = reg.faults[hexd].pop(0) if reg.faults[hexd] else ""
                    reg.ranges[hexd].append(self.headers.get("Range"))
                    reg.accept_encodings[hexd].append(self.headers.get("Accept-Encoding"))
                if src is None or fault == "404":
                    return self._send(404, b"{}")
                if fault == "500":
                    return self._send(500, b"{}")
                if fault == "empty":
                    return self._send(200, b"", "application/octet-stream")
                if fault == "gzip":  # a server that compresses whatever the client asked for
                    import gzip

                    raw = src.read_bytes() if isinstance(src, Path) else src
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    body = gzip.compress(raw, compresslevel=1)
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    with reg.lock:
                        reg.bytes_served[hexd] += len(body)
                    return None
                if isinstance(src, Path):
                    with reg.lock:
                        if hexd not in reg.cache:
                            reg.cache[hexd] = src.read_bytes()
                    data = reg.cache[hexd]
                else:
                    data = src
                if fault == "corrupt":
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start, code = 0, 200
                rng = self.headers.get("Range")
                if rng and fault != "norange":
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        return self._send(416, b"")
                    code = 206
                body = memoryview(data)[start:]
                limit = len(body)
                if fault.startswith("truncate:"):
                    limit = min(limit, int(fault.split(":")[1]))
                self.send_response(code)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                if code == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                sent, t0 = 0, time.perf_counter()
                step = 1 << 20 if not reg.rate else max(1 << 16, int(reg.rate / 100))  # ~10 ms per step when paced
                try:
                    while sent < limit:
                        n = min(step, limit - sent)
                        self.wfile.write(body[sent:sent + n])
                        sent += n
                        with reg.lock:
                            reg.bytes_served[hexd] += n
                        if reg.throttle:
                            time.sleep(reg.throttle)
                        if reg.rate and (ahead := t0 + sent / reg.rate - time.perf_counter()) > 0:
                            time.sleep(ahead)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                if limit < len(body):
                    self.close_connection = True

        return Handler


def main() -> None:
    """``python tests/fake_registry.py FILE [NAMESPACE/MODEL:TAG] [RATE_MB_S]``: serve one model, print the URL, run until killed.

    RATE_MB_S (decimal MB/s, default 0 = as fast as loopback goes) paces every
    blob response like a network link of that speed.
    """
    import sys

    path = Path(sys.argv[1])
    ref = sys.argv[2] if len(sys.argv) > 2 else "library/bench:big"
    ns_model, tag = ref.rsplit(":", 1)
    ns, model = ns_model.split("/")
    reg = FakeRegistry()
    reg.rate = float(sys.argv[3]) * 1e6 if len(sys.argv) > 3 else 0.0
    m = reg.add_model(ns, model, tag, path)
    reg.cache[m["layers"][0]["digest"].split(":")[1]] = path.read_bytes()
    print(reg.url, m["layers"][0]["digest"], flush=True)
    reg.server.serve_forever()


if __name__ == "__main__":
    main()
