"""The chat page's routes: ``index.html`` at ``/`` for a browser, the page's files at ``/web/NAME``.

Only a request whose ``Accept`` names ``text/html`` (what a browser sends for a page, never what an API client
or a load balancer's heartbeat sends) gets the page; every other ``GET /`` keeps ``Ollama is running (ollapy)``.
``serve --no-webui`` or ``OLLAPY_NO_WEBUI=1`` turns the page off (``/`` is then text for every client and
``/web/*`` a 404). The files are the fixed set found in :mod:`ollapy.web` at start (no path from a request
reaches the file system), sent with a Content-Security-Policy that allows scripts, styles and connections to this
origin only: no inline script or style, no frames, no request off the machine (a model's Markdown image pointing
elsewhere is blocked by the browser even if the sanitizer let it through).
"""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from ollapy.web import ROOT

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
       "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""The Content-Security-Policy of the page and its files."""
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
"""Headers of every response of the page (``no-cache``: revalidated by ETag, so an upgrade shows at once)."""
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
         ".png": "image/png", "": "text/plain; charset=utf-8"}
"""Media types of the files the page may serve, by suffix (``LICENSE.*`` and ``VERSIONS`` are text)."""

router = APIRouter()


def page_files(root: Path = ROOT) -> dict[str, Path]:
    """The files under ``root`` that ``/web/NAME`` serves, by their POSIX path relative to ``root``: every file
    of a type in :data:`TYPES` (or a license or ``VERSIONS``), no Python source or cache."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".py":
            continue
        if p.suffix in TYPES or p.name.startswith("LICENSE") or p.name == "VERSIONS":
            out[p.relative_to(root).as_posix()] = p
    return out


FILES = page_files()


def enabled(request: Request) -> bool:
    """True unless the app was created with the page off (``serve --no-webui``, ``OLLAPY_NO_WEBUI``)."""
    return getattr(request.app.state, "webui", True)


def wants_page(request: Request) -> bool:
    """True when the page is on and the request's ``Accept`` names ``text/html`` (a browser)."""
    return enabled(request) and "text/html" in request.headers.get("accept", "").lower()


def page_response() -> Response:
    """``index.html`` with the page's headers."""
    return _file("index.html")


def _file(name: str) -> Response:
    path = FILES[name]
    media = TYPES.get(path.suffix, TYPES[""])
    return FileResponse(path, media_type=media, headers=HEADERS)


@router.get("/web/{name:path}", include_in_schema=False)
@router.head("/web/{name:path}", include_in_schema=False)
async def web_file(name: str, request: Request):
    if not enabled(request) or name not in FILES:
        # Ollama's error shape, as every other route outside /v1 answers a 404
        return JSONResponse({"error": f"no page file {name!r}" if enabled(request) else "the chat page is off (--no-webui)"},
                            status_code=404, headers={"X-Content-Type-Options": "nosniff"})
    return _file(name)
