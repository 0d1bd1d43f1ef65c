"""Prometheus metrics of the server, in its own CollectorRegistry (``GET /metrics``).

Counters and histograms are updated by the routes; slot, queue and prompt-cache
figures are read from the runtime at scrape time by a custom collector.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """All metrics of one app; ``render()`` gives the Prometheus text."""

    def __init__(self, runtime=None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("ollapy_requests", "HTTP generation requests by route and outcome.",
                                ["route", "status"], registry=r)
        self.tokens = Counter("ollapy_tokens", "Tokens processed, by kind (prompt, cached, generated).",
                              ["model", "kind"], registry=r)
        self.ttft = Histogram("ollapy_time_to_first_token_seconds", "Time from request arrival to the first token.",
                              ["model"], buckets=_TTFT_BUCKETS, registry=r)
        self.decode = Histogram("ollapy_decode_seconds_per_token", "Decode time per generated token, per request.",
                                ["model"], buckets=_TOKEN_BUCKETS, registry=r)
        self.runtime = runtime
        r.register(_RuntimeCollector(self))

    def observe_done(self, model: str, metrics: dict, ttft_s: float | None) -> None:
        """Record a finished request's token counts and timings."""
        prompt = int(metrics.get("prompt_eval_count") or 0)
        cached = int(metrics.get("prompt_cache_tokens") or 0)
        gen = int(metrics.get("eval_count") or 0)
        self.tokens.labels(model, "prompt").inc(max(0, prompt - cached))
        self.tokens.labels(model, "cached").inc(cached)
        self.tokens.labels(model, "generated").inc(gen)
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        if gen > 1 and metrics.get("eval_duration"):
            self.decode.labels(model).observe(metrics["eval_duration"] / 1e9 / gen)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)


class _RuntimeCollector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        rt = self.metrics.runtime
        loaded = GaugeMetricFamily("ollapy_models_loaded", "Models currently loaded.")
        busy = GaugeMetricFamily("ollapy_slots_busy", "Slots serving a request.", labels=["model"])
        slots = GaugeMetricFamily("ollapy_slots", "Slots of a loaded model.", labels=["model"])
        queue = GaugeMetricFamily("ollapy_queue_depth", "Requests waiting for a slot.", labels=["model"])
        hits = CounterMetricFamily("ollapy_prompt_cache_hits", "Prompt-cache hits by tier.", labels=["model", "tier"])
        misses = CounterMetricFamily("ollapy_prompt_cache_misses", "Prompt-cache misses.", labels=["model"])
        nbytes = GaugeMetricFamily("ollapy_prompt_cache_bytes", "Bytes held by the prompt cache, by tier.",
                                   labels=["model", "tier"])
        models = list(rt.models.values()) if rt is not None else []
        loaded.add_metric([], len(models))
        for e in models:
            try:
                st = e.model.engine.stats()
            except Exception:  # noqa: BLE001
                continue
            busy.add_metric([e.key], st.get("slots_busy", 0))
            slots.add_metric([e.key], st.get("slots", 0))
            queue.add_metric([e.key], st.get("queue_depth", 0))
            cs = _cache_stats(e.model)
            for tier, v in _per_tier(cs, "hits").items():
                hits.add_metric([e.key, tier], v)
            if "misses" in cs and isinstance(cs["misses"], (int, float)):
                misses.add_metric([e.key], cs["misses"])
            for tier, v in _per_tier(cs, "bytes").items():
                nbytes.add_metric([e.key, tier], v)
        yield from (loaded, busy, slots, queue, hits, misses, nbytes)


def _cache_stats(model) -> dict:
    cache = getattr(model, "cache", None)
    if cache is None or not hasattr(cache, "stats"):
        return {}
    try:
        s = cache.stats()
    except Exception:  # noqa: BLE001
        return {}
    if hasattr(s, "as_dict"):
        s = s.as_dict()
    if not isinstance(s, dict):
        s = dict(getattr(s, "__dict__", {}))
    return s


def _per_tier(stats: dict, what: str) -> dict[str, float]:
    """Find ``{tier: value}`` for hits/bytes in a cache stats dict of unknown exact shape."""
    out: dict[str, float] = {}
    v = stats.get(what)
    if isinstance(v, dict):
        out.update({str(k): float(x) for k, x in v.items() if isinstance(x, (int, float))})
    elif isinstance(v, (int, float)):
        out["all"] = float(v)
    for k, x in stats.items():
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            for tier in ("ram", "disk"):
                if k in (f"{tier}_{what}", f"{what}_{tier}"):
                    out[tier] = float(x)
    return out
