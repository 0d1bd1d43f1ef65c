"""Prefix planning and lifecycles without a model: the planner is pure, the engine runs on a fake backend.

The fake backend (tests/fake_backend.py) behaves like llama.cpp's non-unified
KV cache where it matters: a cross-stream ``seq_cp`` is applied at the next
decode, so a restore after a copy would be corrupted (its decode asserts
that every sequence's buffer matches its cells). The recorded call order is
the assertion.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from fake_backend import FakeBackend

from ollapy.engine.engine import Engine
from ollapy.engine.prefix.planner import (
    COPY_BYTES_PER_TOKEN,
    MIN_GAIN,
    RESTORE_BYTES_PER_TOKEN,
    CacheOffer,
    SlotView,
    plan_prefix,
)
from ollapy.errors import Cancelled
from ollapy.options import Options

OPTS = Options(temperature=0, num_predict=3, repeat_penalty=1.0)


def _view(i, toks, busy=False, last=0.0, held=None):
    return SlotView(i, list(toks), busy, last, len(toks) if held is None else held)


# ---- the pure planner --------------------------------------------------------------------------------------
def test_plan_reuses_the_idle_slot_with_the_longest_prefix():
    prompt = list(range(1, 101))
    slots = [_view(0, range(1, 31), last=1.0), _view(1, range(1, 61), last=0.0)]
    p = plan_prefix(prompt, slots, None, num_ctx=256, kv_bytes_per_token=1000)
    assert (p.kind, p.slot, p.reuse) == ("slot", 1, 60)


def test_plan_always_leaves_one_prompt_token():
    prompt = list(range(1, 51))
    p = plan_prefix(prompt, [_view(0, prompt)], None, num_ctx=256, kv_bytes_per_token=1000)
    assert (p.kind, p.reuse) == ("slot", 49)


def test_plan_copies_from_a_busy_donor_into_the_least_valuable_idle_slot():
    prompt = list(range(1, 201))
    slots = [_view(0, range(1, 151), busy=True), _view(1, [7, 7, 7], last=5.0), _view(2, [], last=9.0)]
    p = plan_prefix(prompt, slots, None, num_ctx=256, kv_bytes_per_token=1000)
    assert (p.kind, p.donor, p.slot, p.reuse) == ("copy", 0, 2, 150)


def test_copy_threshold_counts_the_bytes_the_copy_moves():
    prompt = list(range(1, 201))
    slots = [_view(0, range(1, 101), busy=True), _view(1, range(1, 81))]
    gain = 100 - 80
    assert gain >= MIN_GAIN
    cheap = plan_prefix(prompt, slots, None, num_ctx=256, kv_bytes_per_token=1000)
    assert cheap.kind == "copy"
    # a copy moves num_ctx cells of KV: with a huge context, 20 tokens saved are not worth it
    per_token = (gain * COPY_BYTES_PER_TOKEN) // 256 + 1
    dear = plan_prefix(prompt, slots, None, num_ctx=256, kv_bytes_per_token=per_token)
    assert (dear.kind, dear.reuse) == ("slot", 80)


def test_plan_a_donor_still_prefilling_offers_only_what_it_holds():
    prompt = list(range(1, 201))
    slots = [_view(0, range(1, 201), busy=True, held=40), _view(1, [])]
    p = plan_prefix(prompt, slots, None, num_ctx=256, kv_bytes_per_token=1000)
    assert (p.kind, p.reuse) == ("copy", 40)


def test_plan_prefers_the_cache_only_when_it_gives_more():
    prompt = list(range(1, 201))
    slots = [_view(0, range(1, 101), busy=True), _view(1, range(1, 51))]
    more = plan_prefix(prompt, slots, CacheOffer(180, 180 * 1000, "disk"), num_ctx=256, kv_bytes_per_token=1000)
    assert (more.kind, more.reuse, more.source) == ("cache", 180, "cache disk")
    less = plan_prefix(prompt, slots, CacheOffer(110, 110 * 1000, "ram"), num_ctx=256, kv_bytes_per_token=1000)
    assert (less.kind, less.reuse) == ("copy", 100)


def test_plan_without_any_prefix_is_none():
    p = plan_prefix([5, 6, 7], [_view(0, [1, 2])], None, num_ctx=256, kv_bytes_per_token=1000)
    assert (p.kind, p.reuse, p.source) == ("none", 0, "none")


def test_plan_needs_an_idle_slot():
    with pytest.raises(ValueError):
        plan_prefix([1, 2], [_view(0, [1], busy=True)], None, num_ctx=256, kv_bytes_per_token=1000)


# ---- the engine applies exactly one source -----------------------------------------------------------------
class FakeCache:
    """Offers one saved state; ``refuse`` makes it too long for the fake backend (set_data returns 0);
    ``corrupt`` makes its deferred checksum fail after the restore."""

    block = 16

    def __init__(self, tokens, refuse=False, corrupt=False):
        self.entry = SimpleNamespace(name="e1", tokens=list(tokens), nbytes=len(tokens) * 1000)
        self.refuse = refuse
        self.corrupt = corrupt
        self.events: list[str] = []
        self.stored: list[tuple[int, bool]] = []

    def peek(self, tokens, max_tokens=None, exclude=frozenset()):
        if self.entry.name in exclude:
            return None
        n = 0
        while n < min(len(tokens), len(self.entry.tokens)) and tokens[n] == self.entry.tokens[n]:
            n += 1
        return SimpleNamespace(entry=self.entry, name=self.entry.name, n_tokens=n, nbytes=self.entry.nbytes,
                               tier="disk") if n else None

    def load(self, cand, defer_check=False):
        import numpy as np

        toks = self.entry.tokens + [9] * (10_000 if self.refuse else 0)
        return SimpleNamespace(n_tokens=cand.n_tokens, tokens=list(self.entry.tokens), tier="disk", entry=self.entry,
                               load=lambda: bytearray(np.array(toks, dtype=np.int32).tobytes()),
                               verified=lambda: not (defer_check and self.corrupt))

    def record_corrupt(self, hit):
        self.events.append("corrupt")

    def record_hit(self, hit, promote=True, n_used=None):
        self.events.append("hit")

    def record_refused(self, hit):
        self.events.append("refused")

    def record_miss(self):
        self.events.append("miss")

    def record_reuse(self, tokens, n_tokens, promote=True):
        self.events.append("reuse" if promote else "reuse-no-promote")

    def store(self, tokens, get_state, pinned=False, persist=False, state_size=None, interim=False):
        self.stored.append((len(tokens), persist))

    def close(self, timeout=120.0):
        self.events.append("close")
        return SimpleNamespace(unsaved=0)


def _with_donor(engine, prompt, then):
    """Run ``then()`` while a long request holds a slot: the engine waits inside the donor's first decode step
    after its prefill until ``then`` has submitted, so the donor holds exactly its prompt plus one token.

    The donor's prefill is ceil((N-1)/n_batch) chunk decodes, then the decode of its last prompt token alone
    (the canonical order, ollapy.engine.prefix.evalorder); the step after that is the one held."""
    b = engine.backend
    b.block_at = b.n_decodes + -(-(len(prompt) - 1) // b.n_batch) + 2
    donor = engine.submit(prompt, OPTS.merged({"num_predict": 100000}))
    next(iter(donor))
    req = then()
    b.gate.set()
    out = req.result()
    donor.cancel()
    return out


@pytest.fixture
def engine_parts():
    made = []

    def make(cache=None, n_parallel=2):
        b = FakeBackend(n_parallel=n_parallel)
        e = Engine(b, cache=cache)
        made.append(e)
        return b, e

    yield make
    for e in made:
        e.close()


def test_cache_refused_after_planning_falls_back_to_the_copy_without_both(engine_parts):
    prompt = list(range(1, 160))
    cache = FakeCache(prompt[:150], refuse=True)
    b, e = engine_parts(cache)
    text, last = _with_donor(e, prompt[:100] + [3, 4], lambda: (b.calls.clear(), cache.events.clear(), e.submit(prompt, OPTS))[2])
    names = [c[0] for c in b.calls]
    i_set, i_cp = b.calls.index(("state_set", 1)), b.calls.index(("seq_cp", 0, 1))
    next_decode = names.index("decode", i_cp)
    # the cache was planned and refused (its state cleared), then ONE source applied: the copy, with no
    # restore between the queued copy and the decode that performs it
    assert i_set < i_cp < next_decode and "state_set" not in names[i_cp:next_decode]
    assert cache.events == ["refused", "reuse"]  # the copy that served the prefix is reported
    assert last.metrics.prefix_source == "copy" and last.metrics.prompt_cache_tokens == 100


def test_cache_state_failing_its_deferred_checksum_is_cleared_and_prefilled_cold(engine_parts):
    prompt = list(range(1, 160))
    cache = FakeCache(prompt[:150], corrupt=True)
    b, e = engine_parts(cache)
    cache.events.clear()
    text, last = e.submit(prompt, OPTS).result()
    names = [c[0] for c in b.calls]
    i_set = b.calls.index(("state_set", 0))
    # restored while its checksum ran, then found bad: the slot is cleared before anything decodes on it
    assert names.index("seq_clear", i_set) < names.index("decode", i_set)
    assert cache.events == ["corrupt"]
    assert last.metrics.prefix_source == "none" and last.metrics.prompt_cache_tokens == 0
    cold_text, _ = engine_parts(None)[1].submit(prompt, OPTS).result()
    assert text == cold_text


def test_cache_hit_is_never_combined_with_a_queued_copy(engine_parts):
    prompt = list(range(1, 160))
    cache = FakeCache(prompt[:150])
    b, e = engine_parts(cache)
    text, last = _with_donor(e, prompt[:100] + [3, 4], lambda: (b.calls.clear(), cache.events.clear(), e.submit(prompt, OPTS))[2])
    assert not any(c[0] == "seq_cp" for c in b.calls)  # the cache gives more: no copy queued at all
    assert ("state_set", 1) in b.calls
    # 150 cached, resumed from 148: where a cold run of this prompt ends a chunk (evalorder.canonical_reuse)
    assert last.metrics.prefix_source == "cache disk" and last.metrics.prompt_cache_tokens == 148
    assert cache.events == ["hit"]


class TwoStateCache(FakeCache):
    """Offers saved states longest match first (each ``(tokens, nbytes)``), skipping excluded names."""

    def __init__(self, states):
        super().__init__([0])
        self.entries = [SimpleNamespace(name=f"e{i}", tokens=list(t), nbytes=nb) for i, (t, nb) in enumerate(states)]
        self.offered: list[str] = []

    def peek(self, tokens, max_tokens=None, exclude=frozenset()):
        best = None
        for e in self.entries:
            n = 0
            while n < min(len(tokens), len(e.tokens)) and tokens[n] == e.tokens[n]:
                n += 1
            if e.name not in exclude and n and (best is None or n > best.n_tokens):
                best = SimpleNamespace(entry=e, name=e.name, n_tokens=n, nbytes=e.nbytes, tier="disk")
        if best is not None:
            self.offered.append(best.name)
        return best

    def load(self, cand, defer_check=False):
        self.entry = cand.entry
        return super().load(cand, defer_check)


def test_a_state_not_worth_its_bytes_gives_way_to_a_shorter_saved_prefix(engine_parts):
    """A long chat state shares the most tokens but costs more bytes than those tokens are worth; the
    system-prompt state behind it is restored instead of a cold prefill."""
    prompt = list(range(1, 160))
    chat = prompt[:140] + [7] * 60  # 140 shared tokens, refused on bytes
    system = prompt[:100]
    cache = TwoStateCache([(chat, 140 * RESTORE_BYTES_PER_TOKEN + 1), (system, 100 * 1000)])
    b, e = engine_parts(cache)
    text, last = e.submit(prompt, OPTS).result()
    assert cache.offered == ["e0", "e1"]
    assert last.metrics.prefix_source == "cache disk" and last.metrics.prompt_cache_tokens == 100
    assert [c for c in b.calls if c[0] == "state_set"] == [("state_set", 0)]
    assert cache.events == ["hit"]
    cold_text, _ = engine_parts(None)[1].submit(prompt, OPTS).result()
    assert text == cold_text


def test_greedy_output_is_the_same_whatever_the_source(engine_parts):
    prompt = list(range(1, 160))
    outs = {}
    for label, cache in (("cold", None), ("cache", FakeCache(prompt[:150]))):
        b, e = engine_parts(cache)
        text, last = e.submit(prompt, OPTS, cache=cache is not None).result()
        outs[label] = (text, last.metrics.prefix_source)
    b, e = engine_parts(None)
    text, last = _with_donor(e, prompt[:100] + [3, 4], lambda: e.submit(prompt, OPTS))
    outs["copy"] = (text, last.metrics.prefix_source)
    assert {k: v[1] for k, v in outs.items()} == {"cold": "none", "cache": "cache disk", "copy": "copy"}
    assert len({v[0] for v in outs.values()}) == 1


def test_finished_state_is_stored_ram_only_and_save_points_persist(engine_parts):
    cache = FakeCache([99] * 20)
    b, e = engine_parts(cache)
    prompt = list(range(1, 60))
    e.submit(prompt, OPTS, save_points=(30,)).result()
    # the finished state is its exact cells: the 58 prompt tokens evaluated in chunks, not the last prompt
    # token nor the decoded ones (decode-shaped rows: a longer cold prompt computes them inside a chunk)
    assert cache.stored == [(28, True), (58, False)]  # the save point 30 moved down onto the 4-token chunk grid


def test_cancel_records_the_phase(engine_parts):
    b, e = engine_parts(None, n_parallel=1)
    b.block_at = 3  # decode 1: the chunk [1, 2]; decode 2: the last prompt token alone (first token)
    busy = e.submit([1, 2, 3], OPTS.merged({"num_predict": 100000}))
    next(iter(busy))
    queued = e.submit([4, 5, 6], OPTS)
    queued.cancel()
    # busy too, while the engine waits in its decode: released first, it could reach the fake context's end (a
    # fake decode takes microseconds) and finish before a later cancel
    busy.cancel()
    b.gate.set()
    with pytest.raises(Cancelled):
        queued.result()
    with pytest.raises(Cancelled):
        for _ in busy:
            pass
    assert queued.cancelled_in == "queue" and busy.cancelled_in == "generate"


# ---- lifecycle ---------------------------------------------------------------------------------------------
def test_close_order_engine_then_cache_then_backend():
    from ollapy.engine.model import LoadedModel

    log: list[str] = []
    b = FakeBackend(log=log)
    cache = FakeCache([1] * 20)
    m = LoadedModel.__new__(LoadedModel)  # the real close() over fake parts (no model file)
    m.name, m.backend, m.cache, m.unsaved_states, m._closed = "fake", b, cache, 0, False
    m._embedder, m._embedder_lock, m.draft_backend, m.media = None, threading.Lock(), None, None
    m.engine = Engine(b, cache=cache)
    orig_stop = m.engine.stop

    def stop(timeout=60):
        ok = orig_stop(timeout)
        log.append(f"engine.stop joined={ok}")
        return ok

    m.engine.stop = stop
    cache.close = lambda timeout=120.0: (log.append("cache.close"), SimpleNamespace(unsaved=0))[1]
    with m:
        pass
    assert log == ["engine.stop joined=True", "cache.close", "backend.close"]
    m.close()  # idempotent
    assert log.count("backend.close") == 1


def test_an_engine_that_does_not_stop_is_never_freed():
    from ollapy.engine.model import LoadedModel

    log: list[str] = []
    b = FakeBackend(log=log)
    stuck = threading.Event()
    release = threading.Event()
    real_decode = b.decode

    def slow_decode(*a):
        stuck.set()
        release.wait(30)
        real_decode(*a)

    b.decode = slow_decode
    m = LoadedModel.__new__(LoadedModel)
    m.name, m.backend, m.cache, m.unsaved_states, m._closed = "fake", b, None, 0, False
    m._embedder, m._embedder_lock, m.draft_backend = None, threading.Lock(), None
    m.engine = Engine(b)
    req = m.engine.submit([1, 2, 3], OPTS)
    assert stuck.wait(10)
    orig_stop = m.engine.stop
    m.engine.stop = lambda timeout=60: orig_stop(0.2)
    m.close()
    assert "backend.close" not in log and not b.closed  # leaked on purpose: a decode is still running
    release.set()
    assert orig_stop(10)
    req.cancel()
