"""A loopback-only Hugging Face Hub for tests (set ``HF_ENDPOINT`` to :attr:`FakeHF.url`).

Speaks what huggingface_hub needs for ``list_repo_tree`` and ``hf_hub_download``:
``GET /api/models/<repo>/tree/<rev>``, ``GET /api/models/<repo>[/revision/<rev>]``
and ``HEAD``/``GET /<repo>/resolve/<rev>/<file>`` with ETag, X-Repo-Commit,
X-Linked-Etag/Size and Range. ``requests`` records every path asked for.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote

from fake_registry import sha256_path
from quiet_http import QuietHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHF:
    """Serve repos ``{repo_id: {filename: Path}}`` on ``http://127.0.0.1:<port>``."""

    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos
        self.sha: dict[Path, str] = {}
        self.requests: list[str] = []
        self.server = QuietHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL for HF_ENDPOINT."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def oid(self, path: Path) -> str:
        """sha256 of a served file (cached)."""
        if path not in self.sha:
            self.sha[path] = sha256_path(path)
        return self.sha[path]

    def __enter__(self) -> FakeHF:  # noqa: PYI034 - typing.Self needs 3.11
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, obj: object, code: int = 200) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                if code == 404:
                    self.send_header("X-Error-Code", "RepoNotFound" if "Repository" in str(obj) else "EntryNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", COMMIT)
                self.end_headers()
                self.wfile.write(body)

            def _repo(self, parts: list[str]) -> tuple[str, list[str]] | None:
                for n in (2,):
                    rid = "/".join(parts[:n])
                    if rid in hub.repos:
                        return rid, parts[n:]
                return None

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = unquote(self.path.split("?")[0])
                hub.requests.append(f"{self.command} {path}")
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    found = self._repo(parts[2:])
                    if not found:
                        return self._json({"error": "Repository not found"}, 404)
                    rid, rest = found
                    files = hub.repos[rid]
                    if rest[:1] == ["tree"]:
                        return self._json([{"type": "file", "path": f, "size": p.stat().st_size, "oid": hub.oid(p)[:40],
                                            "lfs": {"oid": hub.oid(p), "size": p.stat().st_size, "pointerSize": 134}}
                                           for f, p in files.items()])
                    return self._json({"id": rid, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]})
                found = self._repo(parts)
                if not found or len(found[1]) < 3 or found[1][0] != "resolve":
                    return self._json({"error": "Entry not found"}, 404)
                rid, rest = found
                fname = "/".join(rest[2:])
                p = hub.repos[rid].get(fname)
                if p is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                size = p.stat().st_size
                start = 0
                rng = self.headers.get("Range")
                if rng and not head:
                    start = int(rng.split("=")[1].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("ETag", f'"{hub.oid(p)}"')
                self.send_header("X-Linked-Etag", f'"{hub.oid(p)}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(size - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.end_headers()
                if head:
                    return None
                with open(p, "rb") as f:
                    f.seek(start)
                    while b := f.read(1 << 20):
                        try:
                            self.wfile.write(b)
                        except (BrokenPipeError, ConnectionResetError):
                            return None
                return None

        return Handler
