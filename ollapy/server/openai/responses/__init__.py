"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

- :mod:`.bodies`: the request body, read into ollapy's chat shape.
- :mod:`.routes`: the routes.
- :mod:`.stream`: the Response object and its stream events.
- :mod:`.store`: stored responses (``store: true``) for ``previous_response_id``.
"""
