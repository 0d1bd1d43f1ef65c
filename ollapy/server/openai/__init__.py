"""OpenAI's API (``/v1/*``) with its wire names, streams and error object.

- :mod:`.bodies`: chat-completion and completion bodies.
- :mod:`.routes`: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.
- :mod:`.embeddings`: ``/v1/embeddings``.
- :mod:`.responses`: the Responses API (``/v1/responses``).
"""
