"""Ollama's API (``/``, ``/api/*``) with its field names and semantics.

- :mod:`.bodies`: request bodies (pydantic) and the shared :class:`~.bodies.NamedBody` (``model`` required).
- :mod:`.routes`: generation: ``/api/generate``, ``/api/chat``, ``/api/version``, ``/``.
- :mod:`.models`: model management: ``/api/tags``, ``/api/show``, ``/api/pull``, ``/api/create``,
  ``/api/copy``, ``/api/delete``, ``/api/ps``.
- :mod:`.create`: ``/api/create``'s fields as a model configuration (no Modelfile text round trip; the path rule).
- :mod:`.embed`: ``/api/embed`` and the legacy ``/api/embeddings``.
- :mod:`.details`: model descriptions shared by ``/api/ps``, ``/api/tags`` and ``/api/show``.
"""
