"""The chat page that ``ollapy serve`` shows a browser at ``/`` (static files, no Python modules).

The page is plain ES modules and CSS, with no build step: ``pip install`` ships these files as package data and
:mod:`ollapy.server.webui` serves them (``/`` for ``index.html`` to a browser, ``/web/NAME`` for the rest) under a
strict Content-Security-Policy. It talks to the server's own Ollama API only (``/api/tags``, ``/api/chat``
streamed, ``/api/pull``, ``/api/ps``, ``/api/delete``) and keeps conversations in the browser's IndexedDB.

Files: ``index.html`` (the page), ``app.css``, ``app.js`` (the chat view and its state), ``api.js`` (the HTTP
client: NDJSON streams, the API key kept in ``sessionStorage``), ``store.js`` (conversations in IndexedDB, export
and import), ``render.js`` (Markdown through marked, sanitized by DOMPurify, code highlighted by highlight.js),
``models.js`` (the models view: pull with progress, list, delete, loaded models). ``vendor/`` holds the
libraries at the versions and sha256 recorded in ``vendor/VERSIONS``, written by ``scripts/vendor_web.sh``.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
"""The directory of the page's files."""
