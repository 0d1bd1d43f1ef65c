"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

- :mod:`.bodies`: request bodies (messages, content blocks, tools, ``cache_control``).
- :mod:`.routes`: the routes.
- :mod:`.stream`: the ``message`` object and its Server-Sent Events stream.
"""
