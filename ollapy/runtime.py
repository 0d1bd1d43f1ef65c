"""Loaded models of a server: keep_alive, at most N loaded, reload only when load-time options change.

The :class:`Runtime` is asyncio-side state. Loading and unloading (which
block for seconds) run in a worker thread; generation runs on each model's
engine thread, so the event loop never blocks.

* ``keep_alive``: how long an idle model stays loaded after its last request
  (default ``OLLAPY_KEEP_ALIVE``, 5 minutes). ``0`` unloads as soon as the
  last request using it ends; a negative value keeps it forever. Accepts
  seconds (number) or Go-style durations (``"5m"``, ``"1h30m"``, ``"-1"``).
* At most ``OLLAPY_MAX_LOADED_MODELS`` models: loading another unloads the
  least recently used idle model first.
* A model is reloaded only when a load-time option (``Options.load_key()``:
  num_ctx, num_batch, num_gpu, num_parallel...) differs from the loaded one.
* Each model's engine has ``OLLAPY_NUM_PARALLEL`` slots (unless the model's
  parameters or the request say otherwise) and a bounded queue
  (``OLLAPY_MAX_QUEUE``): past it, submit raises BusyError (HTTP 503).

Nothing here imports llama_cpp at module level (the engine is imported when
a model is first loaded).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import config
from .duration import parse_duration
from .errors import BusyError, OptionError
from .options import LOAD_OPTIONS, Options

log = logging.getLogger("ollapy.runtime")

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
    """One model held by the runtime."""

    key: str
    ref: Any
    model: Any  # ollapy.engine.model.LoadedModel
    options: Options
    keep_alive: float
    active: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: float = float("inf")  # monotonic time; inf = never
    loaded_at: float = field(default_factory=time.time)
    unloading: bool = False
    unload_task: Any = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def expires_wall(self) -> float | None:
        """Wall-clock expiry time (None = never)."""
        if self.expires_at == float("inf"):
            return None
        return time.time() + (self.expires_at - time.monotonic())


def _default_loader(ref, options: Options):
    from .loader import open_model

    return open_model(ref, options)


class Runtime:
    """The server's loaded models. Use :meth:`acquire` / :meth:`release` around each request."""

    def __init__(self, *, loader: Callable | None = None, resolver: Callable | None = None,
                 max_models: int | None = None, allow_paths: bool = False, defaults: dict | None = None) -> None:
        self.loader = loader or _default_loader
        self.defaults = dict(defaults or {})  # `serve -o`: between OLLAPY_* and the model's parameters
        self.allow_paths = allow_paths
        self.resolver = resolver or self._resolve_name
        self.max_models = max_models or max_loaded()
        self.models: dict[str, Loaded] = {}
        self._lock = asyncio.Lock()
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
        from .loader import close_all

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
                elif entry.active == 0 and not entry.unloading and not getattr(entry.model, "alive", True):
                    log.info("unloading %s: its runner process stopped", entry.key)  # frees its place at once
                    await self._unload(entry)

    # ---- requests -----------------------------------------------------------------------------
    async def resolve(self, name: str):
        """Resolve a model name to a store ref (in a thread: it reads manifests)."""
        return await asyncio.to_thread(self.resolver, name)

    def _resolve_name(self, name: str):
        from .loader import resolve

        return resolve(name, pull=False, allow_paths=self.allow_paths)

    def request_options(self, ref, values: dict | None) -> Options:
        """Defaults (``OLLAPY_*``, then ``serve -o``) < model parameters < request ``options``; raises OptionError."""
        from .loader import base_options

        return base_options(ref, values or {}, defaults=self.defaults)

    async def acquire(self, name: str, values: dict | None = None, keep_alive: Any = None,
                      ref=None) -> tuple[Loaded, Options, int]:
        """Load (or reuse) ``name`` and count a request on it.

        Returns ``(entry, options, load_ns)``: the request's merged options
        (load-time ones equal the loaded model's) and the nanoseconds spent
        loading for this request (0 when it was already loaded). Call
        :meth:`release` when the request ends.
        """
        ka = parse_keep_alive(keep_alive)
        if ref is None:
            ref = await self.resolve(name)
        options = self.request_options(ref, values)
        key = getattr(ref, "name", name)
        load_ns = 0
        async with self._lock:
            entry = self.models.get(key)
            if entry is not None and not getattr(entry.model, "alive", True):
                # its runner process died (e.g. ggml aborted on a lost RPC server): its requests have failed;
                # close what is left of it (the child is gone: nothing to drain) and load it again
                log.warning("reloading %s: its runner process stopped", key)
                await self._unload(entry)
                entry = None
            if entry is not None and (entry.unloading or entry.options.load_key() != options.load_key()):
                if not entry.unloading:
                    log.info("reloading %s: load options changed", key)
                await self._drain_and_unload(entry)
                entry = None
            if entry is None:
                await self._make_room()
                t0 = time.perf_counter_ns()
                model = await asyncio.to_thread(self.loader, ref, options)
                load_ns = time.perf_counter_ns() - t0
                entry = Loaded(key=key, ref=ref, model=model, options=options, keep_alive=ka)
                self.models[key] = entry
            entry.keep_alive = ka
            entry.active += 1
            entry.idle.clear()
            entry.last_used = time.monotonic()
            entry.expires_at = float("inf")
        # request-time options come from the request; load-time ones are the loaded model's
        loaded = {n: getattr(entry.options, n) for n in LOAD_OPTIONS}
        from dataclasses import replace

        return entry, replace(options, **loaded), load_ns

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
    async def _make_room(self) -> None:
        while len(self.models) >= self.max_models:
            idle = [e for e in self.models.values() if e.active == 0 and not e.unloading]
            if not idle:
                raise BusyError(f"{len(self.models)} models are loaded and busy (OLLAPY_MAX_LOADED_MODELS={self.max_models})",
                                hint="retry later or raise OLLAPY_MAX_LOADED_MODELS")
            lru = min(idle, key=lambda e: e.last_used)
            log.info("unloading %s (least recently used) to make room", lru.key)
            await self._unload(lru)

    async def _drain_and_unload(self, entry: Loaded) -> None:
        entry.unloading = True
        while entry.active > 0:
            await entry.idle.wait()
        await self._unload(entry)

    def _unload_task(self, entry: Loaded) -> asyncio.Task:
        """Start unloading ``entry`` once (later calls return the same task)."""
        if entry.unload_task is None:
            entry.unloading = True
            if self.models.get(entry.key) is entry:
                del self.models[entry.key]
            for cb in self.on_unload:
                try:
                    cb(entry)
                except Exception:  # noqa: BLE001
                    log.exception("unload callback failed")
            entry.unload_task = asyncio.get_running_loop().create_task(asyncio.to_thread(entry.model.close))
        return entry.unload_task

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
    """Facts about one loaded model: sizes, slots, queue, cache stats (ollapy extras beside Ollama's)."""
    m = e.model
    try:
        info = m.info()
    except Exception:  # noqa: BLE001
        info = {}
    try:
        stats = m.engine.stats()
    except Exception:  # noqa: BLE001
        stats = {}
    cache = getattr(m, "cache", None)
    cache_stats = cache.snapshot().as_dict() if cache is not None else None
    gpu = e.options.num_gpu != 0 and _gpu_offload()
    kv = int(info.get("kv_bytes_per_slot") or 0) * int(info.get("num_parallel") or 1)
    size = int(info.get("size") or 0) + kv
    return {
        "key": e.key,
        "info": info,
        "stats": stats,
        "cache": cache_stats,
        "size": size,
        "size_vram": size if gpu else 0,
        "expires_at": e.expires_wall(),
        "active": e.active,
        "num_ctx": info.get("num_ctx", e.options.num_ctx),
        "num_parallel": info.get("num_parallel", e.options.num_parallel),
    }


def _gpu_offload() -> bool:
    try:
        from .engine.backend.bindings import supports_gpu_offload

        return supports_gpu_offload()
    except Exception:  # noqa: BLE001
        return False
