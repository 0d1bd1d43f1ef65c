"""Stored responses of ``/v1/responses`` (``store: true``), for ``previous_response_id`` and ``GET /v1/responses/ID``.

Ollama's Responses layer is stateless; OpenAI keeps responses for 30 days. ollapy keeps them in memory,
bounded in bytes (``OLLAPY_RESPONSES_STORE``), least recently used first out: an agent's chain of turns stays
while it is in use, and a restart forgets everything (a client then gets a 404 and sends the whole input).
"""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass

from ollapy.errors import OllapyError


class ResponseNotFound(OllapyError):
    """No stored response of that id: never stored, or evicted from the bounded store. HTTP 404."""

    status = 404
    code = "previous_response_not_found"


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: ``response`` (the Response object as sent) and ``messages``, the conversation
    through it in chat-message shape (its input, earlier turns included, then its output; without its
    ``instructions``, which OpenAI does not carry over to the next response)."""

    response: dict
    messages: list[dict]

    @property
    def size(self) -> int:
        """Bytes it is counted as: the length of both parts as compact JSON."""
        return len(json.dumps([self.response, self.messages], separators=(",", ":")).encode())


class ResponseStore:
    """An in-memory LRU of :class:`StoredResponse` by id, bounded by ``max_bytes`` (each counted by
    :attr:`StoredResponse.size`). Putting evicts the least recently used (put or read) until the total fits;
    a response larger than the whole bound is not kept. ``max_bytes`` 0 keeps nothing.

    Used from the server's event loop only (no lock: no method awaits)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: collections.OrderedDict[str, tuple[StoredResponse, int]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, item: StoredResponse) -> bool:
        """Store ``item`` under ``response_id`` (replacing one of that id); False when it is too large to keep."""
        self.delete(response_id)
        size = item.size
        if size > self.max_bytes:
            return False
        while self._items and self.bytes + size > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
        self._items[response_id] = (item, size)
        self.bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse:
        """The stored response (now the most recently used); raises :class:`ResponseNotFound` (404) when it was
        never stored or has been evicted."""
        got = self._items.get(response_id)
        if got is None:
            raise ResponseNotFound(f"response {response_id!r} not found",
                                   hint="it was not stored (send store: true) or was evicted from the bounded "
                                        "store (OLLAPY_RESPONSES_STORE); send the whole conversation as input")
        self._items.move_to_end(response_id)
        return got[0]

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; whether it was there."""
        got = self._items.pop(response_id, None)
        if got is not None:
            self.bytes -= got[1]
        return got is not None
