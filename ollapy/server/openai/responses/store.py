"""Stored responses of ``/v1/responses`` (``store: true``), for ``previous_response_id`` and ``GET /v1/responses/ID``.

Ollama's Responses layer is stateless; OpenAI keeps responses for 30 days. ollapy keeps them in memory,
bounded in bytes (``OLLAPY_RESPONSES_STORE``), least recently used first out: an agent's chain of turns stays
while it is in use, and a restart forgets everything (a client then gets a 404 and sends the whole input).

What is held is compact JSON (``bytes``), parsed on read, so the bound counts the memory really taken
(``sys.getsizeof`` of each bytes object and of its holder; Python dicts and lists of the same data take several
times their JSON). A chain of responses stores each turn once: a response keeps the messages it added (its new
input, then its output) and a link to the turns of the response it continued, shared with that response and
every other continuation of it. A turn's bytes are counted while some stored response reaches it, so evicting
a response in the middle of a chain frees nothing its continuations still need, and the last response of a
chain that is evicted frees the turns only it reached.
"""
from __future__ import annotations

import collections
import json
import sys

from ollapy.errors import OllapyError


class ResponseNotFound(OllapyError):
    """No stored response of that id: never stored, or evicted from the bounded store. HTTP 404."""

    status = 404
    code = "previous_response_not_found"


def _compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class Turn:
    """The messages one response added to its conversation (compact JSON) and the turn before it (None: the
    first). ``refs``: stored responses and counted turns that reach it (0: not counted)."""

    __slots__ = ("data", "parent", "refs")

    def __init__(self, messages: list[dict], parent: Turn | None) -> None:
        self.data = _compact(messages)
        self.parent = parent
        self.refs = 0

    @property
    def size(self) -> int:
        """Bytes this turn holds: its JSON and its own object."""
        return sys.getsizeof(self.data) + sys.getsizeof(self)


class StoredResponse:
    """One stored response: the Response object as sent (``response``) and, through its :class:`Turn` chain,
    the conversation through it (``messages``: its input, earlier turns included, then its output; without its
    ``instructions``, which OpenAI does not carry over to the next response).

    ``messages`` given here are the ones this response adds after ``parent`` (the response it continues, None
    for the first of a chain); both properties parse the stored JSON on each read."""

    __slots__ = ("data", "turn")

    def __init__(self, response: dict, messages: list[dict], parent: StoredResponse | None = None) -> None:
        self.data = _compact(response)
        self.turn = Turn(messages, parent.turn if parent is not None else None)

    @property
    def response(self) -> dict:
        """The Response object (a new dict on each read)."""
        return json.loads(self.data)

    @property
    def messages(self) -> list[dict]:
        """The whole conversation through this response, oldest turn first (new lists on each read)."""
        chain = []
        t: Turn | None = self.turn
        while t is not None:
            chain.append(t)
            t = t.parent
        out: list[dict] = []
        for t in reversed(chain):
            out.extend(json.loads(t.data))
        return out

    @property
    def size(self) -> int:
        """Bytes it takes alone: its JSON, its object and its own turn (not the shared earlier ones)."""
        return sys.getsizeof(self.data) + sys.getsizeof(self) + self.turn.size


class ResponseStore:
    """An in-memory LRU of :class:`StoredResponse` by id, bounded by ``max_bytes``: every stored response's own
    bytes plus each turn reached from one of them, once. Putting evicts the least recently used (put or read)
    until the total fits; a response that does not fit alone is not kept. ``max_bytes`` 0 keeps nothing.

    Used from the server's event loop only (no lock: no method awaits)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def _hold(self, turn: Turn | None) -> None:
        while turn is not None:
            turn.refs += 1
            if turn.refs > 1:
                return
            self.bytes += turn.size  # newly counted: it now counts for its parent too
            turn = turn.parent

    def _drop(self, turn: Turn | None) -> None:
        while turn is not None:
            turn.refs -= 1
            if turn.refs > 0:
                return
            self.bytes -= turn.size
            turn = turn.parent

    def _remove(self, response_id: str) -> StoredResponse | None:
        item = self._items.pop(response_id, None)
        if item is not None:
            self.bytes -= sys.getsizeof(item.data) + sys.getsizeof(item)
            self._drop(item.turn)
        return item

    def put(self, response_id: str, item: StoredResponse) -> bool:
        """Store ``item`` under ``response_id`` (replacing one of that id); False when it is too large to keep
        (then it is not stored, and what it would have evicted stays)."""
        self._remove(response_id)
        if item.size > self.max_bytes:
            return False
        self._items[response_id] = item
        self.bytes += sys.getsizeof(item.data) + sys.getsizeof(item)
        self._hold(item.turn)
        while self.bytes > self.max_bytes and len(self._items) > 1:
            oldest = next(iter(self._items))
            self._remove(oldest)
        if self.bytes > self.max_bytes:  # alone, with the earlier turns it reaches, it does not fit
            self._remove(response_id)
            return False
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
        return got

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; whether it was there."""
        return self._remove(response_id) is not None
