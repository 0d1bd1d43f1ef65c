"""Per-model scheduling in the server's runtime: locks per model name, memory-aware admission (idle models
unloaded least recently used first), and a bounded wait (OLLAPY_MAX_QUEUE -> BusyError).

The runtime's logic runs here over stand-in runners whose load and close block on events the test controls
(the real models' side is in tests/test_server_sched.py): a scheduling bug shows as a hang, so every wait is
wrapped in a generous guard that fails instead."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ollapy.engine.interface import RunnerSnapshot
from ollapy.errors import BusyError, ModelNotFound
from ollapy.runner.loader import PathRef
from ollapy.server.admission import Resident, choose_evictions
from ollapy.server.scheduler import Runtime

GUARD_S = 60  # a hang guard, not a speed limit


class StandIn:
    """A ModelRunner stand-in: ``info``/``snapshot``/``close`` only, ``alive`` until closed."""

    def __init__(self, name: str, num_ctx: int) -> None:
        self.name, self.num_ctx, self.closed = name, num_ctx, 0
        self.alive = True

    def info(self) -> dict:
        return {"num_ctx": self.num_ctx, "size": 0}

    def snapshot(self) -> RunnerSnapshot:
        return RunnerSnapshot({"slots": 1, "slots_busy": 0, "queue_depth": 0})

    def close(self, timeout: float = 120.0) -> int:
        self.closed += 1
        self.alive = False
        return 0


class Loader:
    """Loads StandIns; a load of a name in ``gates`` waits for its event (``entered`` is set when it starts)."""

    def __init__(self) -> None:
        self.loaded: list[StandIn] = []
        self.gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}

    def __call__(self, ref, options) -> StandIn:
        if ref.name in self.gates:
            self.entered.setdefault(ref.name, threading.Event()).set()
            assert self.gates[ref.name].wait(GUARD_S)
        m = StandIn(ref.name, options.num_ctx)
        self.loaded.append(m)
        return m


def _runtime(loader: Loader, *, sizes: dict[str, int] | None = None, **kw) -> Runtime:
    sizes = sizes or {}
    return Runtime(loader=loader, resolver=lambda name: PathRef(name=name, path=f"/nonexistent/{name}.gguf"),
                   estimator=lambda ref, options: sizes.get(ref.name, 0), **kw)


async def _until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, GUARD_S)


async def _until_true(cond) -> None:
    """Let the other tasks run until ``cond()`` holds (they resolve names and estimate sizes in threads)."""
    for _ in range(GUARD_S * 100):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never met")


def test_a_reload_of_one_model_never_delays_requests_for_another():
    loader = Loader()
    rt = _runtime(loader, max_models=3, max_memory=10**12)

    async def scenario():
        b, _, _ = await rt.acquire("b", {"num_ctx": 512})
        rt.release_nowait(b)
        a, _, _ = await rt.acquire("a", {"num_ctx": 512})
        rt.release_nowait(a)
        loader.gates["a"] = threading.Event()
        reload_a = asyncio.create_task(rt.acquire("a", {"num_ctx": 1024}))  # a new num_ctx: a reload
        await _until(loader.entered.setdefault("a", threading.Event()))  # A's new load is running, holding A's lock
        b2, opts, load_ns = await asyncio.wait_for(rt.acquire("b", {"num_ctx": 512}), GUARD_S)
        assert b2 is b and load_ns == 0 and opts.num_ctx == 512 and not reload_a.done()
        rt.release_nowait(b2)
        loader.gates["a"].set()
        a2, opts_a, _ = await asyncio.wait_for(reload_a, GUARD_S)
        rt.release_nowait(a2)
        return a, a2, opts_a

    a, a2, opts_a = asyncio.run(scenario())
    assert a.model.closed == 1 and a2.model is loader.loaded[-1] and opts_a.num_ctx == 1024


def test_a_request_naming_a_missing_draft_model_leaves_the_loaded_model_alone():
    """Found by a fresh-user trial: a draft model is load-time, so such a request drained and unloaded the loaded
    model before its own load failed. The draft model is looked up first: a 404, the model stays loaded."""
    loader = Loader()
    looked_up: list[str] = []

    def draft_resolver(ref, options):
        looked_up.append(options.draft)
        if options.draft == "nosuch":
            raise ModelNotFound("draft model 'nosuch:latest' not found")
        return f"/models/{options.draft}.gguf"

    rt = _runtime(loader, max_models=3, draft_resolver=draft_resolver)

    async def scenario():
        a, _, _ = await rt.acquire("a", {"num_ctx": 512})  # a request running on A
        with pytest.raises(ModelNotFound, match="draft model 'nosuch:latest' not found"):
            await asyncio.wait_for(rt.acquire("a", {"num_ctx": 512, "draft": "nosuch"}), GUARD_S)
        assert rt.models["a"] is a and not a.unloading and a.model.alive
        rt.release_nowait(a)
        again, _, load_ns = await rt.acquire("a", {"num_ctx": 512})
        rt.release_nowait(again)
        for _ in range(2):  # looked up for the load only, not for each request on the loaded model
            drafting, _, _ = await rt.acquire("b", {"num_ctx": 512, "draft": "d"})
            rt.release_nowait(drafting)
        return a, again, load_ns

    a, again, load_ns = asyncio.run(scenario())
    assert again is a and load_ns == 0 and len(loader.loaded) == 2 and looked_up == ["nosuch", "d"]


def test_a_drain_of_one_model_for_its_reload_never_delays_another():
    """A reload waits for A's running request to end (drain); B's requests go on meanwhile."""
    loader = Loader()
    rt = _runtime(loader, max_models=3)

    async def scenario():
        a, _, _ = await rt.acquire("a", {"num_ctx": 512})  # a request on A, still running
        b, _, _ = await rt.acquire("b", {"num_ctx": 512})
        rt.release_nowait(b)
        reload_a = asyncio.create_task(rt.acquire("a", {"num_ctx": 2048}))
        await _until_true(lambda: a.unloading)  # the reload reached its drain
        assert not reload_a.done()
        for _ in range(3):
            b2, _, load_ns = await asyncio.wait_for(rt.acquire("b", {"num_ctx": 512}), GUARD_S)
            assert b2 is b and load_ns == 0
            rt.release_nowait(b2)
        assert not reload_a.done()  # still draining A
        rt.release_nowait(a)  # A's request ends: the reload goes on
        a2, opts, _ = await asyncio.wait_for(reload_a, GUARD_S)
        rt.release_nowait(a2)
        return a, a2, opts

    a, a2, opts = asyncio.run(scenario())
    assert a.model.closed == 1 and opts.num_ctx == 2048 and a2.model.closed == 0


def test_memory_admission_unloads_idle_models_least_recently_used_first():
    loader = Loader()
    rt = _runtime(loader, sizes={"a": 400, "b": 400, "c": 400, "d": 700}, max_models=8, max_memory=1000)

    async def scenario():
        for name in ("a", "b"):
            e, _, _ = await rt.acquire(name)
            rt.release_nowait(e)
        again, _, _ = await rt.acquire("a")  # A used last: B is the least recently used now
        rt.release_nowait(again)
        await rt.acquire("c")  # 400 + 400 + 400 > 1000: B goes; C stays busy
        after_c = sorted(rt.models)
        with pytest.raises(BusyError, match="no room to load d"):
            await rt.acquire("d")  # 700: even without A, busy C (400) leaves 600
        return after_c, sorted(rt.models)

    after_c, after_d = asyncio.run(scenario())
    assert after_c == ["a", "c"] and after_d == ["a", "c"]
    assert [m.name for m in loader.loaded if m.closed] == ["b"]


def test_a_model_larger_than_the_budget_loads_when_nothing_else_is_loaded():
    loader = Loader()
    rt = _runtime(loader, sizes={"big": 5000}, max_memory=1000)

    async def scenario():
        e, _, _ = await rt.acquire("big")
        rt.release_nowait(e)
        return sorted(rt.models)

    assert asyncio.run(scenario()) == ["big"]


def test_requests_waiting_for_a_model_past_max_queue_get_busy():
    loader = Loader()
    rt = _runtime(loader, max_queue=1)

    async def scenario():
        loader.gates["a"] = threading.Event()
        first = asyncio.create_task(rt.acquire("a"))  # loads (holds A's lock)
        await _until(loader.entered.setdefault("a", threading.Event()))
        second = asyncio.create_task(rt.acquire("a"))  # waits for the load: the one place in the queue
        await _until_true(lambda: rt.waiting == 1)
        with pytest.raises(BusyError, match="1 requests already wait"):
            await rt.acquire("a")
        loader.gates["a"].set()
        e1, _, ns1 = await asyncio.wait_for(first, GUARD_S)
        e2, _, ns2 = await asyncio.wait_for(second, GUARD_S)
        return e1, e2, ns1, ns2, rt.waiting

    e1, e2, ns1, ns2, waiting = asyncio.run(scenario())
    assert e1 is e2 and e1.active == 2 and ns1 > 0 and ns2 == 0 and waiting == 0


def test_a_request_cancelled_during_its_load_leaves_the_model_loaded_not_leaked():
    loader = Loader()
    rt = _runtime(loader)

    async def scenario():
        loader.gates["a"] = threading.Event()
        first = asyncio.create_task(rt.acquire("a"))
        await _until(loader.entered.setdefault("a", threading.Event()))
        first.cancel()  # the client went away while the model loads
        second = asyncio.create_task(rt.acquire("a"))
        loader.gates["a"].set()
        entry, _, _ = await asyncio.wait_for(second, GUARD_S)
        rt.release_nowait(entry)
        assert first.cancelled()
        return entry

    entry = asyncio.run(scenario())
    assert len(loader.loaded) == 1 and entry.model is loader.loaded[0] and entry.active == 0


@pytest.mark.parametrize(("need", "residents", "budget", "available", "max_models", "want"), [
    (100, [], 10, None, 1, ([], True)),  # nothing loaded: always
    (100, [Resident("a", 100, False, 1.0)], 1000, None, 3, ([], True)),  # fits beside A
    (100, [Resident("a", 100, False, 1.0)], 150, None, 3, (["a"], True)),
    (100, [Resident("a", 50, False, 2.0), Resident("b", 50, False, 1.0)], 160, None, 3, (["b"], True)),
    (100, [Resident("a", 90, True, 1.0)], 150, None, 3, ([], False)),  # busy A holds the room
    (100, [Resident("a", 10, False, 2.0), Resident("b", 10, True, 1.0)], None, 10**9, 2, (["a"], True)),  # count
    (100, [Resident("a", 10, True, 1.0)], None, 10**9, 1, ([], False)),
    (100, [Resident("a", 10, False, 1.0)], None, 50, 3, (["a"], True)),  # available memory: A's bytes come back
    (100, [Resident("a", 10, False, 1.0)], None, None, 3, ([], True)),  # memory unknown: count only
])
def test_choose_evictions(need, residents, budget, available, max_models, want):
    assert choose_evictions(need, residents, budget=budget, available=available, max_models=max_models) == want


def test_the_load_estimate_matches_what_the_loaded_model_reports(smollm2_path, gemma_path):
    """The admission estimate from the GGUF header alone: SmolLM2's KV bytes per token equal the loaded
    model's own figure; Gemma 3 (head dim 256 from ``key_length``, not embedding / heads) gets 18 layers x 1 KV
    head x (256 + 256) x 2 bytes."""
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options
    from ollapy.server.admission import estimate_load

    with LoadedModel(smollm2_path, Options(num_ctx=512, num_parallel=2)) as m:
        info = m.info()
    est = estimate_load(smollm2_path, 512, 2)
    assert est.kv == info["kv_bytes_per_slot"] * 2 and est.weights == smollm2_path.stat().st_size
    gem = estimate_load(gemma_path, 1000, 1, "q8_0")
    assert gem.kv == int(18 * 1 * (256 + 256) * 34 / 32) * 1000


@pytest.mark.parametrize("limits", [{"max_models": 1}, {"max_models": 8}])
def test_two_simultaneous_loads_of_two_models_see_each_other(limits, monkeypatch):
    """Two requests for two models at once, with room for one (one model, or 1000 bytes of memory available
    for two 600-byte models): one loads, the other is a 503 (was: both decided before either was recorded, and
    both loaded). The estimates are held until both have started, so both decisions overlap."""
    import ollapy.server.scheduler as scheduler

    monkeypatch.delenv("OLLAPY_MAX_MEMORY", raising=False)
    loader = Loader()
    # 1000 bytes free before any load, 600 less per model loaded (or plenty, where the count is the limit)
    monkeypatch.setattr(scheduler, "available_memory", lambda: 1000 - 600 * len([m for m in loader.loaded if
                                                                                    not m.closed])
                        if limits["max_models"] > 1 else 10**12)
    both = threading.Barrier(2, timeout=5)

    def estimator(ref, options) -> int:
        try:
            both.wait()  # neither estimate returns until both loads have asked for one
        except threading.BrokenBarrierError:
            pass  # a runtime that estimates one load at a time: the first waits the barrier's timeout alone
        return 600

    rt = Runtime(loader=loader, resolver=lambda name: PathRef(name=name, path=f"/nonexistent/{name}.gguf"),
                 estimator=estimator, **limits)

    async def scenario():
        results = await asyncio.wait_for(asyncio.gather(rt.acquire("a"), rt.acquire("b"), return_exceptions=True),
                                         GUARD_S)
        return results, sorted(rt.models)

    results, loaded = asyncio.run(scenario())
    busy_errors = [r for r in results if isinstance(r, BusyError)]
    assert len(busy_errors) == 1 and "no room to load" in str(busy_errors[0]), results
    assert len(loaded) == 1 and len(loader.loaded) == 1


def test_a_just_loaded_model_is_not_evicted_before_its_request_counts_on_it():
    """The request that loaded a model holds it from the moment it is registered: a load of another model
    deciding in between sees it busy (was: idle, so evicted under its own request)."""
    loader = Loader()
    rt = _runtime(loader, max_models=1, max_memory=10**12)

    async def scenario():
        a, _, _ = await rt.acquire("a")
        assert a.active == 1
        with pytest.raises(BusyError):
            await rt.acquire("b")
        rt.release_nowait(a)
        return a

    a = asyncio.run(scenario())
    assert a.active == 0 and not a.model.closed
