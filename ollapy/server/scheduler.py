"""Loaded models of a server: keep_alive, per-model scheduling, memory-aware admission, bounded waiting.

The :class:`Runtime` is asyncio-side state. Loading and unloading (which
block for seconds) run in worker threads; generation runs on each model's
engine thread; every round trip to a runner (prompt building, submit,
embeddings) runs on that model's own executor with a timeout (:meth:`Runtime.call`),
so the event loop never blocks and a stopped runner child holds up only its own requests.

* ``keep_alive``: how long an idle model stays loaded after its last request
  (default ``OLLAPY_KEEP_ALIVE``, 5 minutes). ``0`` unloads as soon as the
  last request using it ends; a negative value keeps it forever. Accepts
  seconds (number) or Go-style durations (``"5m"``, ``"1h30m"``, ``"-1"``).
* Locks per model name: a load, drain or unload of A holds only A's lock, so a
  reload of A never delays B's requests or streams (no lock is held across
  another model's load).
* Admission (:mod:`ollapy.server.admission`, after Ollama's scheduler): a load needs
  room: fewer than ``OLLAPY_MAX_LOADED_MODELS`` models and its estimated bytes
  (weights + KV cache) within the memory available (or ``OLLAPY_MAX_MEMORY``).
  Idle models are unloaded least recently used first to make room; when busy
  models hold it, the request gets BusyError (HTTP 503 with ``Retry-After``).
* A model is reloaded only when a load-time option (``Options.load_key()``:
  num_ctx, num_batch, num_gpu, num_parallel...) differs from the loaded one, except that a
  request whose ``num_ctx`` fits in the loaded context is served by it (:func:`fits_loaded`: aider sends
  its own ``num_ctx``, about 1.25 x its prompt + 8192, with every message, and Ollama reloads whenever it
  changes). One that does not fit reloads once, with the context rounded up to a power of two
  (:func:`grown_context`), so that a growing conversation does not reload at every message. The prompt
  cache is not keyed by the context size: the reloaded model reuses what the old one saved.
* Waiting is bounded by ``OLLAPY_MAX_QUEUE``: requests waiting here for a
  model (its load or reload) and, in each engine, requests waiting for a slot;
  past it, BusyError (HTTP 503 with ``Retry-After``), as Ollama's
  ``OLLAMA_MAX_QUEUE``.

Nothing here imports llama_cpp at module level (the engine is imported when
a model is first loaded).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ollapy import config
from ollapy.duration import parse_duration
from ollapy.errors import BusyError, OllapyError, OptionError, PathNotAllowed, RunnerError
from ollapy.options import LOAD_OPTIONS, Options, draft_model
from ollapy.server.admission import Resident, available_memory, choose_evictions, estimate_load

log = logging.getLogger("ollapy.server.scheduler")

DRAFT_PATHS_REFUSED = "a draft model given as a file path on the server is not accepted here"
RUNNER_THREADS = 8  # threads per model for round trips to it (a stopped runner ties up only these)


def parse_keep_alive(value: Any) -> float:
    """Seconds for a keep_alive value: number (seconds) or duration text; negative means forever (``inf``).

    ``None`` or ``""`` gives the ``OLLAPY_KEEP_ALIVE`` default. Raises OptionError
    for anything :func:`ollapy.duration.parse_duration` refuses.
    """
    if value is None or value == "":
        return config.keep_alive()
    try:
        return parse_duration(value if isinstance(value, (bool, int, float)) else str(value), allow_negative=True)
    except ValueError:
        raise OptionError(f"keep_alive {value!r} is not a duration", hint="use e.g. 5m, 1h, 30s, 0 or -1") from None


def max_loaded() -> int:
    """``OLLAPY_MAX_LOADED_MODELS`` (at least 1)."""
    return config.max_loaded_models()


@dataclass
class Loaded:
    """One model held by the runtime: its runner (a :class:`~ollapy.engine.interface.ModelRunner`), options,
    requests in flight, keep_alive clock, bytes held (estimated at admission, then the runner's own figures)
    and the executor its round trips run on."""

    key: str
    ref: Any
    model: Any  # ollapy.engine.interface.ModelRunner
    options: Options
    keep_alive: float
    size: int = 0
    active: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float = float("inf")  # monotonic time; inf = never
    loaded_at: float = field(default_factory=time.time)
    unloading: bool = False
    unload_task: Any = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    executor: concurrent.futures.ThreadPoolExecutor = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.executor is None:
            self.executor = concurrent.futures.ThreadPoolExecutor(RUNNER_THREADS,
                                                                  thread_name_prefix=f"runner-call-{self.key}")

    def expires_wall(self) -> float | None:
        """Wall-clock expiry time (None = never)."""
        if self.expires_at == float("inf"):
            return None
        return time.time() + (self.expires_at - time.monotonic())


def _trained_context(model) -> int:
    """The trained context of a loaded model (0 when its runner cannot say)."""
    try:
        return int(model.facts.n_ctx_train)
    except Exception:  # noqa: BLE001 - a stopped runner: no cap
        return 0


def _default_draft_resolver(ref, options: Options):
    from ollapy.runner.loader import checked_draft_path

    return checked_draft_path(ref, options)


def _default_loader(ref, options: Options):
    from ollapy.runner.loader import open_model

    return open_model(ref, options)


def _default_estimator(ref, options: Options) -> int:
    """Estimated bytes of loading ``ref`` with ``options`` (0 when its file cannot be read: the load says why)."""
    try:
        return estimate_load(ref.path, options.num_ctx, options.num_parallel, options.kv_cache_type).total
    except (OSError, OllapyError, AttributeError, TypeError):
        return 0


def check_server_path(text: str, allow_paths: bool, message: str, hint: str) -> None:
    """Refuse a model or draft model that a client names by a file path on the server: PathNotAllowed (400) with
    ``message`` and ``hint``, the same words whether or not the file exists (its text alone decides: nothing on
    disk is looked at). With ``allow_paths`` (``serve --allow-paths``) an absolute path passes; a relative one
    never does (it would resolve against the server's working directory)."""
    from ollapy.runner.loader import is_path_like, is_path_name

    if is_path_like(text) and not (allow_paths and is_path_name(text)):
        raise PathNotAllowed(message, hint=hint)


def fits_loaded(loaded: Options, wanted: Options, trained: int = 0) -> bool:
    """True when a model loaded with ``loaded`` can serve a request of ``wanted``: the same load-time options,
    and a ``num_ctx`` no larger than the loaded one, counting a request beyond the model's trained context
    ``trained`` (0: unknown) as asking for that context (as Ollama caps it)."""
    asked = min(wanted.num_ctx, trained) if trained > 0 else wanted.num_ctx
    if asked > loaded.num_ctx:
        return False
    return replace(wanted, num_ctx=loaded.num_ctx).load_key() == loaded.load_key()


def grown_context(wanted: int, trained: int) -> int:
    """The context (tokens) to reload with for a request of ``wanted`` tokens that does not fit the loaded one:
    the next power of two, at most the model's trained context ``trained`` (0: unknown) unless less than
    ``wanted`` was trained (then ``trained``, as Ollama caps a request there)."""
    size = 1 << max(0, wanted - 1).bit_length()
    return min(size, trained) if trained > 0 else size


def busy(message: str, hint: str) -> BusyError:
    """A BusyError: the server answers 503 with ``Retry-After`` (``ollapy.server.errors.error_headers``)."""
    return BusyError(message, hint=hint)


class Runtime:
    """The server's loaded models. Use :meth:`acquire` / :meth:`release` around each request, :meth:`call` for
    each round trip to a model's runner."""

    def __init__(self, *, loader: Callable | None = None, resolver: Callable | None = None,
                 max_models: int | None = None, allow_paths: bool = False, defaults: dict | None = None,
                 estimator: Callable | None = None, max_memory: int | None = None,
                 max_queue: int | None = None, draft_resolver: Callable[[Any, Options], Any] | None = None) -> None:
        self.loader = loader or _default_loader
        # (ref, options) -> the draft model's file; raises ModelNotFound, DraftMismatch (loader.checked_draft_path)
        self.draft_resolver = draft_resolver or _default_draft_resolver
        self.estimator = estimator or _default_estimator
        self.defaults = dict(defaults or {})  # `serve -o`: between OLLAPY_* and the model's parameters
        self.allow_paths = allow_paths
        self.resolver = resolver or self._resolve_name
        self.max_models = max_models or max_loaded()
        self.max_memory = max_memory if max_memory is not None else config.max_memory()
        self.max_queue = max_queue if max_queue is not None else config.max_queue()
        self.models: dict[str, Loaded] = {}
        self.waiting = 0  # requests waiting in acquire() for a model's lock (its load, reload or unload)
        self._locks: dict[str, asyncio.Lock] = {}
        self._loading: dict[str, int] = {}  # key -> estimated bytes of a load in progress (decided, not registered)
        self._admission = asyncio.Lock()  # one load decides at a time, seeing every load decided before it
        self._closing: dict[str, asyncio.Task] = {}  # key -> unload of its previous instance
        self._loads: dict[str, asyncio.Task] = {}  # key -> its load in progress
        self._reaper: asyncio.Task | None = None
        self.on_unload: list[Callable[[Loaded], None]] = []

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the keep_alive reaper (call from the running event loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def shutdown(self) -> None:
        """Unload every model (each close stops its engine, saves its cache, frees it), then drain the writers."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for entry in list(self.models.values()):
            await self._unload(entry)
        from ollapy.runner.loader import close_all

        unsaved = await asyncio.to_thread(close_all)
        if unsaved:
            log.warning("prompt cache: %d state(s) not saved", unsaved)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for entry in list(self.models.values()):
                if entry.active == 0 and not entry.unloading and entry.expires_at <= now:
                    log.info("keep_alive expired: unloading %s", entry.key)
                    await self._unload(entry)
                elif entry.active == 0 and not entry.unloading and not entry.model.alive:
                    log.info("unloading %s: its runner process stopped", entry.key)  # frees its place at once
                    await self._unload(entry)

    # ---- requests -----------------------------------------------------------------------------
    async def resolve(self, name: str):
        """Resolve a model name to a store ref (in a thread: it reads manifests)."""
        return await asyncio.to_thread(self.resolver, name)

    def _resolve_name(self, name: str):
        from ollapy.runner.loader import PATHS_REFUSED, PATHS_REFUSED_HINT, resolve

        check_server_path(name, self.allow_paths, PATHS_REFUSED, PATHS_REFUSED_HINT)
        return resolve(name, pull=False, allow_paths=self.allow_paths)

    def request_options(self, ref, values: dict | None) -> Options:
        """Defaults (``OLLAPY_*``, then ``serve -o``) < model parameters < request ``options``; raises OptionError."""
        from ollapy.runner.loader import PATHS_REFUSED_HINT, base_options

        draft = (values or {}).get("draft")
        if isinstance(draft, str):  # a request's; the model's own DRAFT may be a path (create checked it)
            check_server_path(draft_model(draft) or "", self.allow_paths, DRAFT_PATHS_REFUSED, PATHS_REFUSED_HINT)
        return base_options(ref, values or {}, defaults=self.defaults)

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def acquire(self, name: str, values: dict | None = None, keep_alive: Any = None,
                      ref=None) -> tuple[Loaded, Options, int]:
        """Load (or reuse) ``name`` and count a request on it.

        Returns ``(entry, options, load_ns)``: the request's merged options
        (load-time ones equal the loaded model's) and the nanoseconds spent
        loading for this request (0 when it was already loaded). Call
        :meth:`release` when the request ends. Holds only this model's lock
        while loading, draining or unloading it. Raises BusyError (503) when
        ``OLLAPY_MAX_QUEUE`` requests already wait here, or when busy models
        leave no room for the load; the loader's errors (ModelLoadError...).
        """
        ka = parse_keep_alive(keep_alive)
        if ref is None:
            ref = await self.resolve(name)
        options = self.request_options(ref, values)
        key = getattr(ref, "name", name)
        resident = self.models.get(key)
        if draft_model(options.draft) and (resident is None or resident.options.load_key() != options.load_key()):
            # a (re)load with a draft model: a missing one is a 404, another vocabulary a 400, before anything is
            # drained for it
            await asyncio.to_thread(self.draft_resolver, ref, options)
        lock = self._lock(key)
        if lock.locked() and self.waiting >= self.max_queue:
            raise busy(f"server busy: {self.waiting} requests already wait for a model to load",
                       hint="retry later, or raise OLLAPY_MAX_QUEUE")
        load_ns = 0
        self.waiting += 1
        counted = True
        try:
            async with lock:
                self.waiting -= 1
                counted = False
                unfinished = self._loads.get(key)
                if unfinished is not None:  # a load whose request was cancelled: let it land first
                    await asyncio.wait([unfinished])
                entry = self.models.get(key)
                if entry is not None and not entry.model.alive:
                    # its runner process died (e.g. ggml aborted on a lost RPC server): its requests have failed;
                    # close what is left of it (the child is gone: nothing to drain) and load it again
                    log.warning("reloading %s: its runner process stopped", key)
                    await self._unload(entry)
                    entry = None
                trained = _trained_context(entry.model) if entry is not None else 0
                if entry is not None and (entry.unloading or not fits_loaded(entry.options, options, trained)):
                    if entry.unloading:
                        pass  # already going: load what this request asks for
                    elif fits_loaded(replace(entry.options, num_ctx=options.num_ctx), options):  # only num_ctx grew
                        grown = grown_context(options.num_ctx, trained)
                        log.info("reloading %s: num_ctx %d does not fit the loaded %d; loading %d", key,
                                 options.num_ctx, entry.options.num_ctx, grown)
                        options = replace(options, num_ctx=grown)
                    else:
                        log.info("reloading %s: load options changed", key)
                    await self._drain_and_unload(entry)
                    entry = None
                fresh = entry is None
                if fresh:  # the load counts this request on the model as it registers it (no idle window)
                    entry, load_ns = await self._load(key, ref, options, ka)
                entry.keep_alive = ka
                if not fresh:
                    entry.active += 1
                entry.idle.clear()
                entry.last_used = time.monotonic()
                entry.expires_at = float("inf")
        finally:
            if counted:  # cancelled (client gone) while waiting for the lock
                self.waiting -= 1
        # request-time options come from the request; load-time ones are the loaded model's
        loaded = {n: getattr(entry.options, n) for n in LOAD_OPTIONS}
        return entry, replace(options, **loaded), load_ns

    async def _load(self, key: str, ref, options: Options, ka: float) -> tuple[Loaded, int]:
        """Load ``key`` on a task of the runtime's own (see :meth:`_load_task`) and wait for it; a request
        cancelled meanwhile (client gone) leaves the load to finish and the model managed, never leaked."""
        task = asyncio.get_running_loop().create_task(self._load_task(key, ref, options, ka))
        self._loads[key] = task
        task.add_done_callback(lambda t: self._loads.pop(key, None) if self._loads.get(key) is t else None)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:  # the request is gone: the request count the load made for it goes too
            task.add_done_callback(lambda t: self.release_nowait(t.result()[0])
                                   if not t.cancelled() and t.exception() is None else None)
            raise

    async def _load_task(self, key: str, ref, options: Options, ka: float) -> tuple[Loaded, int]:
        """Make room for ``key`` (unloading idle models), load it in a thread, register it with one request
        counted on it (the one that asked for the load: :meth:`acquire`).

        Loads decide one at a time (``_admission``): the estimate, the memory measured and the choice of
        evictions of one load happen after every earlier load was recorded in ``_loading``, so two loads never
        decide without seeing each other (with room for one, the second is a 503)."""
        previous = self._closing.get(key)
        if previous is not None:
            await asyncio.shield(previous)  # its last instance is still closing: wait for its memory
        try:
            async with self._admission:
                need = await asyncio.to_thread(self.estimator, ref, options)
                await self._make_room(key, need)
            t0 = time.perf_counter_ns()
            model = await asyncio.to_thread(self.loader, ref, options)
        finally:
            self._loading.pop(key, None)
        load_ns = time.perf_counter_ns() - t0
        entry = Loaded(key=key, ref=ref, model=model, options=options, keep_alive=ka, size=loaded_size(model, need),
                       active=1)
        self.models[key] = entry
        return entry, load_ns

    def release_nowait(self, entry: Loaded) -> None:
        """A request on ``entry`` ended: start its keep_alive clock, or schedule the unload for keep_alive 0.

        Synchronous, so it can run in a ``finally`` of a cancelled task.
        """
        entry.active = max(0, entry.active - 1)
        entry.last_used = time.monotonic()
        if entry.active == 0:
            entry.idle.set()
            if entry.keep_alive == 0:
                self._unload_task(entry)
            else:
                entry.expires_at = time.monotonic() + entry.keep_alive

    async def release(self, entry: Loaded) -> None:
        """Async form of :meth:`release_nowait`."""
        self.release_nowait(entry)

    async def load_only(self, name: str, values: dict | None, keep_alive: Any) -> tuple[Loaded, int]:
        """Load a model without generating (Ollama's empty prompt); returns ``(entry, load_ns)``."""
        entry, _, load_ns = await self.acquire(name, values, keep_alive)
        await self.release(entry)
        return entry, load_ns

    async def unload(self, name: str, ref=None) -> bool:
        """Unload ``name`` once its running requests end (keep_alive 0 semantics). False if not loaded."""
        if ref is None:
            try:
                ref = await self.resolve(name)
            except Exception:  # noqa: BLE001
                ref = None
        key = getattr(ref, "name", name)
        entry = self.models.get(key)
        if entry is None:
            return False
        entry.keep_alive = 0
        if entry.active == 0:
            await self._unload(entry)
        return True

    # ---- internals ----------------------------------------------------------------------------
    async def _make_room(self, key: str, need: int) -> None:
        """Unload idle models (least recently used first) until a load of ``need`` bytes fits (see
        :func:`ollapy.server.admission.choose_evictions`); raises BusyError when busy models hold the room. Each evicted
        model is removed at once (no await between the choice and the removal) and closed on its own task;
        this waits for those closes, holding no lock but ``key``'s."""
        residents = [Resident(e.key, e.size, e.active > 0 or e.unloading, e.last_used)
                     for e in self.models.values() if e.key != key]
        residents += [Resident(k, n, True, float("inf")) for k, n in self._loading.items() if k != key]
        budget = self.max_memory
        avail = None if budget is not None else await asyncio.to_thread(available_memory)
        if avail is not None:  # memory measured now does not show what the loads in progress are about to take
            avail = max(0, avail - sum(n for k, n in self._loading.items() if k != key))
        victims, fits = choose_evictions(need, residents, budget=budget, available=avail, max_models=self.max_models)
        if fits:  # recorded before any await: the next load to decide counts this one
            self._loading[key] = need
        else:
            gib = 2 ** 30
            room = (f"{need / gib:.1f} GiB needed, " + (f"OLLAPY_MAX_MEMORY {budget / gib:.1f} GiB" if budget is not None
                    else f"{(avail or 0) / gib:.1f} GiB available")) if need else ""
            raise busy(f"no room to load {key}: {len(residents)} models are loaded and busy "
                       f"(OLLAPY_MAX_LOADED_MODELS={self.max_models}{'; ' + room if room else ''})",
                       hint="retry later, or raise OLLAPY_MAX_LOADED_MODELS / OLLAPY_MAX_MEMORY")
        tasks = []
        for victim in victims:
            entry = self.models.get(victim)
            if entry is not None:
                log.info("unloading %s (least recently used) to make room for %s", victim, key)
                tasks.append(self._unload_task(entry))
        for task in tasks:
            await asyncio.shield(task)

    async def _drain_and_unload(self, entry: Loaded) -> None:
        entry.unloading = True
        while entry.active > 0:
            await entry.idle.wait()
        await self._unload(entry)

    def _unload_task(self, entry: Loaded) -> asyncio.Task:
        """Start unloading ``entry`` once (later calls return the same task); it leaves :attr:`models` now."""
        if entry.unload_task is None:
            entry.unloading = True
            if self.models.get(entry.key) is entry:
                del self.models[entry.key]
            for cb in self.on_unload:
                try:
                    cb(entry)
                except Exception:  # noqa: BLE001
                    log.exception("unload callback failed")
            task = asyncio.get_running_loop().create_task(self._close(entry))
            entry.unload_task = task
            self._closing[entry.key] = task
            task.add_done_callback(lambda t, key=entry.key: self._closing.pop(key, None)
                                   if self._closing.get(key) is t else None)
        return entry.unload_task

    async def _close(self, entry: Loaded) -> None:
        try:
            await asyncio.to_thread(entry.model.close)
        finally:
            entry.executor.shutdown(wait=False, cancel_futures=True)

    async def call(self, entry: Loaded, fn: Callable, *args, timeout: float | None = None,
                   late: Callable[[Any], None] | None = None, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` (a round trip to ``entry``'s runner) on ``entry``'s own executor, awaited
        for at most ``timeout`` s (default ``OLLAPY_RUNNER_TIMEOUT``), never on the event loop.

        Raises what ``fn`` raises, or RunnerError (502) past the timeout; then ``late`` (if given) is called
        with ``fn``'s result should it still arrive (e.g. to cancel a generation nobody waits for).
        """
        limit = config.runner_timeout() if timeout is None else timeout
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(entry.executor, lambda: fn(*args, **kwargs))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), limit)
        except asyncio.TimeoutError:
            if late is not None:
                fut.add_done_callback(lambda f: late(f.result()) if not f.cancelled() and f.exception() is None
                                      else None)
            raise RunnerError(f"the model runner for {entry.key} did not answer within {limit:g}s",
                              hint="it may be stopped or overloaded; raise OLLAPY_RUNNER_TIMEOUT") from None
        except asyncio.CancelledError:
            if late is not None:
                fut.add_done_callback(lambda f: late(f.result()) if not f.cancelled() and f.exception() is None
                                      else None)
            raise

    async def _unload(self, entry: Loaded) -> None:
        await asyncio.shield(self._unload_task(entry))

    # ---- status -------------------------------------------------------------------------------
    def ps(self) -> list[dict]:
        """One dict per loaded model, for ``/api/ps``."""
        out = []
        for e in sorted(self.models.values(), key=lambda e: -e.last_used):
            out.append(model_status(e))
        return out


def model_status(e: Loaded) -> dict:
    """Facts about one loaded model: sizes, slots, queue, cache stats (ollapy extras beside Ollama's).

    Reads only what the runner keeps at hand (:meth:`~ollapy.engine.interface.ModelRunner.info` and
    :meth:`~ollapy.engine.interface.ModelRunner.snapshot`): never a round trip, so a stopped runner child cannot
    stall ``/api/ps``; its figures are marked ``stale`` with their ``age_s``.
    """
    m = e.model
    try:
        info = m.info()
    except Exception:  # noqa: BLE001
        info = {}
    snap = m.snapshot()
    cache_stats = snap.cache.as_dict() if snap.cache is not None else None
    size = e.size or loaded_size(m)
    # the runner's own figure (the server process never loads llama.cpp for it): [layers on devices, layers];
    # weights and KV go with their layers (llama.cpp's offload_kqv)
    on_gpu, layers = info.get("gpu_layers") or (0, 1)
    return {
        "key": e.key,
        "info": info,
        "stats": dict(snap.stats),
        "stale": snap.stale(),
        "age_s": round(snap.age_s(), 1),
        "cache": cache_stats,
        "size": size,
        "size_vram": size * on_gpu // max(1, layers),
        "expires_at": e.expires_wall(),
        "active": e.active,
        "num_ctx": info.get("num_ctx", e.options.num_ctx),
        "num_parallel": info.get("num_parallel", e.options.num_parallel),
    }


def loaded_size(model, estimate: int = 0) -> int:
    """Bytes a loaded model holds: its weights plus every slot's KV cache, and a draft model's (from its
    ``info()``), else ``estimate``."""
    try:
        info = model.info()
        size = int(info.get("size") or 0) + int(info.get("kv_bytes_per_slot") or 0) * int(info.get("num_parallel") or 1)
        size += int(info.get("draft_size") or 0)
    except Exception:  # noqa: BLE001 - a figure only
        size = 0
    return size or estimate
