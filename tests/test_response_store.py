"""The Responses store is bounded by the memory it really holds, and a chain of responses stores each turn once."""
from __future__ import annotations

import gc
import tracemalloc

from ollapy.server.openai.responses.store import ResponseStore, StoredResponse


def _messages(turn: int, n: int = 40) -> list[dict]:
    """Many small messages: Python dicts of them take several times their compact JSON."""
    return [{"role": "user" if i % 2 else "assistant", "content": f"t{turn}m{i}"} for i in range(n)]


def _response(rid: str) -> dict:
    return {"id": rid, "object": "response", "output": [{"type": "message", "content": [{"type": "output_text",
                                                                                           "text": "ok"}]}]}


def test_the_bound_counts_the_memory_really_held():
    bound = 256 * 1024
    store = ResponseStore(bound)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(400):  # far more than fits: the store evicts down to its bound
            store.put(f"r{i}", StoredResponse(_response(f"r{i}"), _messages(i)))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert store.bytes <= bound
    assert held <= 1.3 * bound, f"the store holds {held} bytes for a bound of {bound}"
    assert store.get("r399").messages == _messages(399)


def test_a_chain_stores_each_turn_once():
    store = ResponseStore(64 * 1024 * 1024)
    previous = None
    turn_bytes = 0
    for i in range(60):
        item = StoredResponse(_response(f"r{i}"), _messages(i, 10), previous)
        turn_bytes += item.size
        assert store.put(f"r{i}", item)
        previous = store.get(f"r{i}")
    # each response adds its own turn: the store holds the sum of the turns, not every prefix again
    assert store.bytes == turn_bytes
    assert store.get("r59").messages == [m for i in range(60) for m in _messages(i, 10)]
    assert store.get("r30").messages == [m for i in range(31) for m in _messages(i, 10)]


def test_evicting_the_middle_of_a_chain_keeps_its_continuations_whole():
    store = ResponseStore(64 * 1024 * 1024)
    a = StoredResponse(_response("a"), _messages(0, 5))
    store.put("a", a)
    b = StoredResponse(_response("b"), _messages(1, 5), store.get("a"))
    store.put("b", b)
    c = StoredResponse(_response("c"), _messages(2, 5), store.get("b"))
    store.put("c", c)
    total = store.bytes
    assert store.delete("b")
    assert store.bytes == total - (b.size - b.turn.size)  # b's turn is still reached from c
    assert store.get("c").messages == _messages(0, 5) + _messages(1, 5) + _messages(2, 5)
    assert store.delete("a") and store.delete("c") and store.bytes == 0


def test_a_response_continuing_an_evicted_one_counts_its_turns_again():
    store = ResponseStore(64 * 1024 * 1024)
    store.put("a", StoredResponse(_response("a"), _messages(0, 5)))
    a = store.get("a")
    store.delete("a")
    assert store.bytes == 0
    b = StoredResponse(_response("b"), _messages(1, 5), a)  # the request held a while it generated
    assert store.put("b", b)
    assert store.bytes == b.size + a.turn.size
    assert store.get("b").messages == _messages(0, 5) + _messages(1, 5)
