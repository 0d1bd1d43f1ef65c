"""Write-behind of a sliding-window model's interim save points (ollapy.cache.policy), without a model.

A sliding-window state carries its window's cells whatever its length, so writing every turn's save point writes a
window per turn. Here the system prompt's save point is written through, a conversation's own save points wait, a
longer one of the same chain makes their writes unnecessary (they stay in RAM), and what is still waiting is
written when due, when evicted from RAM, and at close. The synthetic states are tests/test_cache_blocks.py's.
Real models: scripts/bench_cache_blocks.py measures the rows; tests/test_cache_block_models.py runs a Gemma
conversation through this and resumes it from a new cache; tests/test_answer_reuse.py resumes one in a new
``ollapy run`` process.
"""
from __future__ import annotations

import time

from test_cache_blocks import SYSTEM, B, _bound, fake_state

from ollapy.cache.diskcap import block_usage

SWA = 512


def _turns(n: int) -> list[list[int]]:
    """``n`` growing save points of one conversation after SYSTEM (each turn adds 2 blocks and a bit)."""
    out, conv = [], list(SYSTEM)
    for t in range(n):
        conv = conv + [9000 + 1000 * t + j for j in range(2 * B + 11)]
        out.append(list(conv))
    return out


def _store(c, tokens, persist=False, interim=False):
    c.store(list(tokens), lambda: fake_state(list(tokens)), persist=persist, interim=interim)


def _on_disk(c) -> set[int]:
    """Token counts of the entries whose files are on disk once the queued writes are done (deferred ones stay)."""
    c.disk.flush(10)
    return {len(e.tokens) for e in c.entries.values() if e.on_disk}


def test_a_conversation_writes_its_system_prompt_and_its_newest_save_point_once(tmp_path):
    c = _bound(tmp_path, n_swa=SWA)
    _store(c, SYSTEM, persist=True)
    written_sys = c.snapshot().bytes_written
    assert written_sys > 0  # the shared prefix is written through
    turns = _turns(6)
    for t, point in enumerate(turns):
        _store(c, point, persist=True, interim=True)
        answer = turns[t + 1][: len(point) + 3] if t + 1 < len(turns) else point + [77, 78, 79]
        _store(c, answer, persist=False)  # the finished state (prompt + answer): RAM only
        assert c.snapshot().bytes_written == written_sys, f"turn {t} wrote before the conversation paused"
    snap = c.snapshot()
    # each save point made the previous one's write unnecessary; that one still serves a partial prompt from RAM
    assert snap.superseded == len(turns) - 1
    hit = c.lookup(turns[0] + [5, 6, 7])
    assert hit is not None and hit.tier == "ram" and len(hit.tokens) == len(turns[0])
    c.record_hit(hit, promote=False)
    c.close()
    assert _on_disk(c) == {len(SYSTEM), len(turns[-1])}
    u = block_usage(c.root)
    assert u["entries"] == 2
    # a new process resumes the conversation from its newest save point, and a new one from the system prompt
    c2 = _bound(tmp_path, n_swa=SWA)
    hit = c2.lookup(turns[-1] + [5, 6, 7])
    assert hit is not None and hit.tier == "disk" and len(hit.tokens) == len(turns[-1])
    assert bytes(hit.load()) == bytes(fake_state(turns[-1]))
    c2.record_hit(hit, promote=False)
    hit = c2.lookup(SYSTEM + [1, 2, 3])
    assert hit is not None and len(hit.tokens) == len(SYSTEM)
    c2.close()


def test_a_trimmable_model_still_writes_every_save_point_through(tmp_path):
    c = _bound(tmp_path)  # no sliding window: a longer state serves its prefixes too
    turns = _turns(3)
    for point in turns:
        before = c.snapshot().bytes_written
        _store(c, point, persist=True, interim=True)
        assert c.snapshot().bytes_written > before
    c.close()


def test_a_paused_conversation_is_written_when_due_and_its_next_turn_replaces_the_file(tmp_path):
    c = _bound(tmp_path, n_swa=SWA)
    c.write_delay = 0.3
    first, second = _turns(2)
    _store(c, first, persist=True, interim=True)
    deadline = time.monotonic() + 10
    while len(first) not in _on_disk(c):  # the sync thread writes it about a second after it is due
        assert time.monotonic() < deadline, "a due write was never queued"
        time.sleep(0.1)
    assert c.snapshot().superseded == 0
    _store(c, second, persist=True, interim=True)
    assert len(first) in _on_disk(c)  # not yet: the longer one is not written
    assert c.write_due(everything=True) == 1
    assert _on_disk(c) == {len(second)}  # written, and the paused turn's interim file deleted
    assert not list(c.disk.dir.glob("*.pin"))
    c.close()


def test_an_evicted_deferred_state_is_written_not_lost(tmp_path):
    one = len(fake_state(_turns(1)[0]))
    c = _bound(tmp_path, n_swa=SWA, ram_bytes=int(2.5 * one))
    point = _turns(1)[0]
    _store(c, point, persist=True, interim=True)
    assert c.snapshot().bytes_written == 0
    for i in range(3):  # other conversations' states push it out of RAM
        _store(c, [40_000 + 1000 * i + j for j in range(len(point))], persist=False)
    e = next(e for e in c.entries.values() if len(e.tokens) == len(point))
    assert e.payload is None and e.due == 0
    assert len(point) in _on_disk(c)
    c.close()
    c2 = _bound(tmp_path, n_swa=SWA)
    assert bytes(c2.lookup(point + [1, 2]).load()) == bytes(fake_state(point))
    c2.close()


def test_a_pinned_state_is_written_through_and_never_superseded(tmp_path):
    c = _bound(tmp_path, n_swa=SWA)
    first, second = _turns(2)
    c.store(list(first), lambda: fake_state(first), persist=True, pinned=True, interim=True)
    assert _on_disk(c) == {len(first)}
    _store(c, second, persist=True, interim=True)
    assert c.snapshot().superseded == 0
    assert c.write_due(everything=True) == 1
    assert _on_disk(c) == {len(first), len(second)}
    c.close()


def test_a_save_point_a_few_tokens_past_a_finished_state_is_not_copied_and_that_state_is_written_instead(tmp_path):
    """A chat's next turn starts with the previous answer's end-of-turn markers: a save point 2 tokens past the
    finished state would carry another whole window for 2 tokens. The finished state takes its role: no copy out
    of llama.cpp, one window less in RAM, and it is the file a new process resumes from."""
    c = _bound(tmp_path, n_swa=SWA)
    _store(c, SYSTEM, persist=True)
    finished = _turns(1)[0]
    _store(c, finished, persist=False)  # RAM only
    held = c.ram.bytes
    point = finished + [41, 42]
    copied = []
    c.store(list(point), lambda: copied.append(1) or fake_state(point), persist=True, interim=True)
    assert not copied and c.ram.bytes == held  # never copied out, nothing more held
    assert c.snapshot().skipped_stores == 1
    hit = c.lookup(point + [5, 6, 7])  # what the save point would have served, less 2 tokens
    assert hit is not None and len(hit.tokens) == len(finished)
    c.record_hit(hit, promote=False)
    c.close()
    assert _on_disk(c) == {len(SYSTEM), len(finished)}  # written as the save point, at close
    c2 = _bound(tmp_path, n_swa=SWA)
    hit = c2.lookup(point + [5, 6, 7])
    assert hit is not None and hit.tier == "disk" and bytes(hit.load()) == bytes(fake_state(finished))
    c2.record_hit(hit, promote=False)
    c2.close()


def test_a_trimmable_model_stores_a_save_point_however_near(tmp_path):
    c = _bound(tmp_path)
    finished = _turns(1)[0]
    _store(c, finished, persist=False)
    before = c.snapshot().stores
    _store(c, finished + [41, 42], persist=True, interim=True)
    assert c.snapshot().stores == before + 1
    c.close()


def test_near_means_what_no_restore_is_planned_for():
    from ollapy.cache.policy import NEAR_TOKENS
    from ollapy.engine.prefix.planner import MIN_GAIN

    assert NEAR_TOKENS == MIN_GAIN


def _conversation(k: int, n: int) -> list[list[int]]:
    """Conversation ``k``'s ``n`` finished states after SYSTEM (each turn adds 2 blocks and a bit)."""
    out, conv = [], list(SYSTEM)
    for t in range(n):
        conv = conv + [100_000 * (k + 1) + 1000 * t + j for j in range(2 * B + 11)]
        out.append(list(conv))
    return out


def _turn(c, prev: list[int] | None, finished: list[int], restore: bool) -> None:
    """One turn as the engine runs it: continue from ``prev`` (restored from the cache, or held by the slot), the
    save point two tokens past it (the previous answer's end-of-turn markers), then the finished state."""
    if prev is not None:
        if restore:
            hit = c.lookup(finished)
            assert hit is not None and len(hit.tokens) == len(prev)
            c.record_hit(hit, promote=False)
        else:
            c.record_reuse(finished, len(prev), promote=False)
        _store(c, finished[: len(prev) + 2], persist=True, interim=True)
    _store(c, finished, persist=False)


def _held(c) -> set[int]:
    return {len(e.tokens) for e in c.entries.values() if e.payload is not None}


def test_interleaved_conversations_keep_one_state_each_in_ram_and_write_their_newest_once(tmp_path):
    """Ten conversations x three turns on one slot (the 10x3 row of scripts/bench_cache_blocks.py): each turn
    restores its conversation's previous finished state, which the new finished state then replaces in RAM, its
    deferred write moving along. RAM holds one state per conversation, not one per turn; at close each
    conversation's newest state is written, once, and a new process resumes it."""
    c = _bound(tmp_path, n_swa=SWA)
    _store(c, SYSTEM, persist=True)
    convs = [_conversation(k, 3) for k in range(10)]
    for t in range(3):
        for conv in convs:
            _turn(c, conv[t - 1] if t else None, conv[t], restore=True)
    held = {n for n in _held(c) if n != len(SYSTEM)}
    assert held == {len(convs[0][2])}  # every conversation's turn 3 (all equally long), nothing older
    assert sum(1 for e in c.entries.values() if e.payload is not None) == 11
    assert c.snapshot().continued == 20
    c.close()
    on_disk = [e for e in c.entries.values() if e.on_disk]
    assert sorted(len(e.tokens) for e in on_disk) == [len(SYSTEM)] + [len(convs[0][2])] * 10
    c2 = _bound(tmp_path, n_swa=SWA)
    hit = c2.lookup(convs[3][2] + [5, 6, 7])
    assert hit is not None and hit.tier == "disk" and bytes(hit.load()) == bytes(fake_state(convs[3][2]))
    c2.record_hit(hit, promote=False)
    c2.close()


def test_a_conversation_that_keeps_its_slot_holds_two_states_and_writes_its_save_point(tmp_path):
    """On the slot path the previous finished state carries the deferred write (the save point it stands in for)
    and stays; the ones before it go. Bytes written stay what they were: SYSTEM and that save point, once."""
    c = _bound(tmp_path, n_swa=SWA)
    _store(c, SYSTEM, persist=True)
    conv = _conversation(0, 6)
    for t in range(6):
        _turn(c, conv[t - 1] if t else None, conv[t], restore=False)
    assert _held(c) == {len(SYSTEM), len(conv[4]), len(conv[5])}
    assert c.snapshot().continued == 4
    c.close()
    assert _on_disk(c) == {len(SYSTEM), len(conv[4])}
