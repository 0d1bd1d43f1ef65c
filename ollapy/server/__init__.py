"""The HTTP server of ``ollapy serve``: one subpackage per API over one generation path.

Shared, at this level:

- :mod:`.app`: :func:`~.app.create_app`, the FastAPI application (routers, middleware, lifespan).
- :mod:`.scheduler`: :class:`~.scheduler.Runtime`, the loaded models (keep_alive, max loaded, queueing).
- :mod:`.admission`: memory-aware admission of loads (size estimate, free memory, which idle model goes).
- :mod:`.generation`: start a generation on the scheduler and stream its chunks (every API's path).
- :mod:`.embedding`: embedding requests shared by Ollama's and OpenAI's routes.
- :mod:`.fim`: code completion (fill-in-the-middle) shared by ``/api/generate``, ``/v1/completions`` and ``/infill``.
- :mod:`.bodies`: the request-body bases every API shares (the ``model`` rule, tools, history, ``think``).
- :mod:`.http`, :mod:`.errors`: reading a body, error responses, streaming; the one exception→status table.
- :mod:`.auth`, :mod:`.hosts`, :mod:`.origins`, :mod:`.metrics`: the API key; the ``Host`` allow-list (DNS
  rebinding); the ``Origin`` allow-list (CORS, and 403 to other sites' pages); Prometheus ``/metrics``.
- :mod:`.accesslog`: one log line per request (status, seconds, client, method, path), as Ollama's server writes.

One subpackage per API, each with its bodies (pydantic), routes and stream encoder:

- :mod:`.ollama`: ``/api/*`` (generate, chat, models, embeddings).
- :mod:`.openai`: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``, and
  :mod:`.openai.responses` (``/v1/responses``).
- :mod:`.anthropic`: ``/v1/messages`` (Anthropic's Messages API).
- :mod:`.llamacpp`: llama.cpp server's ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/infill``.
- :mod:`.webui`: the chat page for browsers at ``/`` (its files in :mod:`ollapy.web`) under a strict CSP.

fastapi and uvicorn are imported only here (never by ``ollapy --help``, ``list`` or ``ps``).
"""
