"""Prometheus metrics of the server, in its own CollectorRegistry (``GET /metrics``).

Counters and histograms are updated by the routes; slot, queue and prompt-cache
figures are read at scrape time by a custom collector from each runner's
snapshot (:meth:`~ollapy.engine.interface.ModelRunner.snapshot`: never a round trip to a runner child; a stale
one is reported by ``ollapy_runner_stale``).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# the prompt cache's remote tier (ollapy.cache.stats.CacheStats remote_*; 0 without one): events since the store
# client opened are counters (exposed with their _total), what holds now gauges
REMOTE_COUNTERS = {
    "misses": "Stored remote entries that could not serve (evicted, failed a check, the store failed).",
    "corrupt": "Remote values that failed a check (counted misses, never loaded).",
    "partial": "Remote restores of a verified prefix of a block chain.",
    "gated": "Remote entries left because prefilling was cheaper than fetching.",
    "bytes_read": "Bytes read from the remote store.",
    "bytes_written": "Bytes the remote store took (SET NX that stored).",
    "errors": "Remote store operations that failed (timeouts, refused connections).",
    "dropped": "Writes for the remote store dropped (queue full, breaker open).",
}
REMOTE_GAUGES = {
    "queue_depth": "Writes waiting for the remote store.",
    "breaker_open": "1 while the circuit breaker skips the remote store.",
    "probe_us": "The last remote lookup round trip, in microseconds.",
}
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """All metrics of one app; ``render()`` gives the Prometheus text."""

    def __init__(self, runtime=None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("ollapy_requests", "HTTP generation requests by route and outcome.",
                                ["route", "status"], registry=r)
        self.tokens = Counter("ollapy_tokens", "Tokens of finished requests, by kind (prompt, cached, generated; "
                              "drafted and draft_accepted: speculative decoding's verified and accepted drafted "
                              "tokens); a cancelled request's count up to where it stopped.",
                              ["model", "kind"], registry=r)
        self.ttft = Histogram("ollapy_time_to_first_token_seconds", "Time from request arrival to the first token.",
                              ["model"], buckets=_TTFT_BUCKETS, registry=r)
        self.decode = Histogram("ollapy_decode_seconds_per_token", "Decode time per generated token, per request.",
                                ["model"], buckets=_TOKEN_BUCKETS, registry=r)
        self.runtime = runtime
        r.register(_RuntimeCollector(self))

    def observe_done(self, model: str, metrics: dict, ttft_s: float | None) -> None:
        """Record a request's token counts and timings when it ends (finished, or cancelled: its figures so far)."""
        prompt = int(metrics.get("prompt_eval_count") or 0)
        cached = int(metrics.get("prompt_cache_tokens") or 0)
        gen = int(metrics.get("eval_count") or 0)
        self.tokens.labels(model, "prompt").inc(max(0, prompt - cached))
        self.tokens.labels(model, "cached").inc(cached)
        self.tokens.labels(model, "generated").inc(gen)
        if metrics.get("draft"):
            self.tokens.labels(model, "drafted").inc(int(metrics.get("draft_tokens") or 0))
            self.tokens.labels(model, "draft_accepted").inc(int(metrics.get("draft_accepted") or 0))
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        if gen > 1 and metrics.get("eval_duration"):
            self.decode.labels(model).observe(metrics["eval_duration"] / 1e9 / gen)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)


class _RuntimeCollector:
    """Scrape-time figures: models, slots, queues, and each model's prompt-cache :class:`CacheStats`."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        rt = self.metrics.runtime
        loaded = GaugeMetricFamily("ollapy_models_loaded", "Models currently loaded.")
        busy = GaugeMetricFamily("ollapy_slots_busy", "Slots serving a request.", labels=["model"])
        stale = GaugeMetricFamily("ollapy_runner_stale", "1 when a model's figures were not refreshed lately (its "
                                  "runner is stopped or hung): the figures shown are its last ones.", labels=["model"])
        slots = GaugeMetricFamily("ollapy_slots", "Slots of a loaded model.", labels=["model"])
        queue = GaugeMetricFamily("ollapy_queue_depth", "Requests waiting for a slot.", labels=["model"])
        hits = CounterMetricFamily("ollapy_prompt_cache_hits", "Prompt-cache hits by tier.", labels=["model", "tier"])
        misses = CounterMetricFamily("ollapy_prompt_cache_misses", "Prompt-cache misses.", labels=["model"])
        reused = CounterMetricFamily("ollapy_prompt_cache_tokens_reused", "Prompt tokens restored from the cache.",
                                     labels=["model"])
        written = CounterMetricFamily("ollapy_prompt_cache_written_bytes", "Bytes of states written to the disk tier.",
                                      labels=["model"])
        files = CounterMetricFamily("ollapy_prompt_cache_written_files", "State files written to the disk tier.",
                                    labels=["model"])
        nbytes = GaugeMetricFamily("ollapy_prompt_cache_bytes", "Bytes held by the prompt cache, by tier.",
                                   labels=["model", "tier"])
        b_written = CounterMetricFamily("ollapy_prompt_cache_block_written", "KV blocks written to the disk tier "
                                        "(blocks the disk did not hold yet).", labels=["model"])
        b_reused = CounterMetricFamily("ollapy_prompt_cache_block_reused", "KV blocks a disk write found there "
                                       "already (stored once, referenced again).", labels=["model"])
        b_evicted = CounterMetricFamily("ollapy_prompt_cache_block_evicted", "KV blocks the RAM tier freed (their "
                                        "last entry was evicted).", labels=["model"])
        superseded = CounterMetricFamily("ollapy_prompt_cache_superseded", "States a longer save point of their "
                                         "conversation replaced before they were written (sliding-window models' "
                                         "write-behind).", labels=["model"])
        continued = CounterMetricFamily("ollapy_prompt_cache_continued", "RAM-only states dropped because the "
                                        "finished state of a request that continued from them took their role "
                                        "(sliding-window models).", labels=["model"])
        dangling = CounterMetricFamily("ollapy_prompt_cache_dangling", "Entry files dropped at a restore because a "
                                       "KV block they name was gone.", labels=["model"])
        b_shared = GaugeMetricFamily("ollapy_prompt_cache_block_shared_bytes", "Bytes of RAM-tier KV blocks that two "
                                     "or more entries share.", labels=["model"])
        b_held = GaugeMetricFamily("ollapy_prompt_cache_block_bytes", "Bytes of KV blocks held in the RAM tier.",
                                   labels=["model"])
        b_logical = GaugeMetricFamily("ollapy_prompt_cache_logical_bytes", "The RAM tier's entries as whole states "
                                      "(over ollapy_prompt_cache_bytes{tier=\"ram\"}: the dedupe ratio).",
                                      labels=["model"])
        restore = GaugeMetricFamily("ollapy_prompt_cache_restore_buffer_bytes", "Bytes of the buffer a restore joins "
                                    "blocks into (kept while the model is loaded, as large as the largest state "
                                    "restored; not in ollapy_prompt_cache_bytes).", labels=["model"])
        queued = GaugeMetricFamily("ollapy_prompt_cache_queued_bytes", "Bytes of states waiting in the disk writer's "
                                   "queue (bounded by its budget; not in ollapy_prompt_cache_bytes).", labels=["model"])
        remote = {name: CounterMetricFamily(f"ollapy_prompt_cache_remote_{name}", doc, labels=["model"])
                  for name, doc in REMOTE_COUNTERS.items()}
        remote.update({name: GaugeMetricFamily(f"ollapy_prompt_cache_remote_{name}", doc, labels=["model"])
                       for name, doc in REMOTE_GAUGES.items()})
        models = list(rt.models.values()) if rt is not None else []
        loaded.add_metric([], len(models))
        for e in models:
            snap = e.model.snapshot()  # what the runner last refreshed: never a round trip to a runner child
            st = snap.stats
            stale.add_metric([e.key], 1 if snap.stale() else 0)
            busy.add_metric([e.key], st.get("slots_busy", 0))
            slots.add_metric([e.key], st.get("slots", 0))
            queue.add_metric([e.key], st.get("queue_depth", 0))
            cs = snap.cache
            if cs is None:
                continue
            hits.add_metric([e.key, "ram"], cs.hits_ram)
            hits.add_metric([e.key, "disk"], cs.hits_disk)
            hits.add_metric([e.key, "remote"], getattr(cs, "hits_remote", 0))
            for name, fam in remote.items():
                fam.add_metric([e.key], getattr(cs, f"remote_{name}", 0))
            misses.add_metric([e.key], cs.misses)
            reused.add_metric([e.key], cs.tokens_reused)
            written.add_metric([e.key], cs.bytes_written)
            files.add_metric([e.key], cs.files_written)
            nbytes.add_metric([e.key, "ram"], cs.ram_bytes)
            b_written.add_metric([e.key], getattr(cs, "blocks_written", 0))
            b_reused.add_metric([e.key], getattr(cs, "blocks_reused", 0))
            b_evicted.add_metric([e.key], getattr(cs, "blocks_evicted", 0))
            superseded.add_metric([e.key], getattr(cs, "superseded", 0))
            continued.add_metric([e.key], getattr(cs, "continued", 0))
            dangling.add_metric([e.key], getattr(cs, "dangling", 0))
            b_shared.add_metric([e.key], getattr(cs, "ram_shared_bytes", 0))
            b_held.add_metric([e.key], getattr(cs, "ram_block_bytes", 0))
            b_logical.add_metric([e.key], getattr(cs, "ram_logical_bytes", 0))
            restore.add_metric([e.key], getattr(cs, "restore_buffer_bytes", 0))
            queued.add_metric([e.key], getattr(cs, "queued_bytes", 0))
        yield from (loaded, stale, busy, slots, queue, hits, misses, reused, written, files, nbytes, b_written, b_reused,
                    b_evicted, superseded, continued, dangling, b_shared, b_held, b_logical, restore, queued,
                    *remote.values())
