"""The HTTP server of ``ollapy serve``: Ollama routes (/api/*), OpenAI routes (/v1/*), /metrics.

Build the app with :func:`ollapy.server.app.create_app`. fastapi and uvicorn
are imported only here (never by ``ollapy --help``, ``list`` or ``ps``).
"""
