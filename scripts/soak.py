#!/usr/bin/env python3
"""Soak test of ``ollapy serve``: many concurrent clients over a few slots for minutes, judged at the end.

By default it starts its own server (``OLLAPY_NUM_PARALLEL=--slots``, ``OLLAPY_MAX_LOADED_MODELS=1``, a fresh
store holding the SmolLM2 test model twice, as ``soak`` and ``soak-b``, a 256 MiB prompt-cache RAM tier) and
runs ``--clients`` clients for ``--minutes``. Each client loops over a mix of requests: ``/api/chat`` and
``/api/generate`` (whole answers), ``/api/embed``, ``/v1/chat/completions`` streamed, ``/api/chat`` streamed,
streams cancelled after their first chunk, Anthropic's ``/v1/messages`` (half of them streamed) and
``/v1/responses`` (stored, each client chaining up to four turns with ``previous_response_id``).

A second-model phase (server started here only): at 40% of the run the clients switch to ``soak-b``, and once
it has served a tenth of the run (55% at the latest) back to ``soak``, so the first and last windows judged
flat both run on ``soak``. Each switch is done as Ollama's clients do on a one-model server: the clients hold
their next request, one asks for the old model's unload (an empty prompt with ``keep_alive: 0``: it unloads
once its requests in flight and queued end) and loads the new one (an empty prompt; while the old one still
holds the room the answer is a 503 "busy", counted apart as ``switch``, sent again after ``Retry-After``); then
the clients go on with the new model. Holding the clients bounds the drain by the requests already sent (at
most one per client), whatever the machine's load: while every client asked for ``soak-b`` and got 503s
instead (the earlier design), a busy machine never drained ``soak``'s queue in the window. The loads seen in
``/api/ps`` are reported and judged (at least the two switches), and the time the clients were held.

Also in the mix (issue 53): ``image`` (``/api/chat`` with one of four small pictures, so requests with the same
picture run in parallel; ``soak`` is SmolLM2 with a synthetic projector from scripts/make_test_vlm.py),
``tools`` (``/v1/chat/completions`` with a tool), ``oversize`` (three 6,000 x 6,000 PNGs of a few KB each: an
intended 400 over ``OLLAPY_REQUEST_IMAGE_PIXELS``, counted as done; anything else is an error). The server it
starts runs under ``ulimit -n`` ``--nofile`` (512, soft and hard) and is restarted once before the measured run
(after a warm-up that writes the prompt cache), so the run begins with cache restores from disk (judged: disk
hits seen in ``/metrics``). Every 10 s the server's open descriptors, threads, memory mappings and RSS are
sampled; judged flat: the mean of the first window (10 minutes, or a third of a shorter run) against the last's,
within 5% (RSS net of the prompt cache's bounded bytes).

Reported: requests per kind, errors (any answer but 200, an error inside a stream, a client-side exception;
503 "busy" answers are counted apart, being documented, with the share of answers served and the 503s'
reasons), the server process's RSS, open file descriptors and threads at the start (after a warm-up) and at
the end (after the load stops), and p50/p99 time to first token of the streamed requests (it includes the wait
for a slot: 64 clients share 4 slots). A timeline samples, every 10 s, open fds, threads, memory mappings, RSS
(anonymous and file-backed), the loaded models and the prompt cache's bytes from ``/metrics`` (RAM tier,
restore buffer, disk writer's queue); its per-minute means are printed as the curves. Judged: 0 errors, fds and threads flat (at
most +8 each: worker pools come and go), RSS net of the prompt cache bounded (at most +10% + 64 MiB; the cache
bytes, read from ``/metrics`` at the same moment as RSS, are subtracted from both ends), the RAM tier within its
``OLLAPY_CACHE_RAM``, every kind exercised. Each target prints one ``ok`` or ``MISSED`` line; the exit status
is 1 when one is missed.

    python scripts/soak.py --minutes 30              # issue 53's run: 64 clients, 4 slots, ulimit -n 512
    python scripts/soak.py --minutes 10              # the earlier issue's run
    python scripts/soak.py --minutes 4 --no-swap     # no second-model phase (its memory told apart)
    python scripts/soak.py --minutes 2 --url http://127.0.0.1:11435 --model smol   # against a running server
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ("You are a helpful assistant for a soak test. Answer briefly and plainly, in one or two sentences, "
          "without lists or headings. " * 3)
QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 plus 2?", "Say hello.",
             "What do bees make?", "Name a planet.", "What is water made of?", "Name a fruit.",
             "What is the opposite of hot?", "How many legs does a cat have?", "Name a musical instrument.",
             "What color is the sky?"]
KINDS = ("chat", "generate", "embed", "v1_stream", "chat_stream", "cancelled", "anthropic", "responses", "image",
         "tools", "oversize")
SAMPLE_EVERY_S = 10.0  # the server is sampled this often (fds, threads, mappings, RSS)
FLAT_WINDOW_S = 600.0  # first vs last window compared (a third of a shorter run)
FLAT_TOLERANCE = 0.05
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}]
VISION_MODEL = "soak"  # the model with a projector: image requests go to it only
# An idle connection is dropped by the client after 2 s, before the server's keep-alive of 5 s (uvicorn's) closes
# it: with both at 5 s (httpx's default) a request sent on a connection idle just under 5 s meets the server's
# close (a ReadError; seen when the clients resume after a model switch). HTTP/1.1 leaves that race to the
# client (RFC 9112 9.3.1: retry, or drop idle connections first); the soak drops them first.
CLIENT_LIMITS = httpx.Limits(keepalive_expiry=2.0)


def _png(img) -> bytes:
    import io

    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def make_pictures() -> tuple[list[str], list[str]]:
    """Four small pictures (base64 PNG) and three solid 6,000 x 6,000 ones (over the request pixel budget)."""
    import base64

    from PIL import Image

    small = [base64.b64encode(_png(Image.effect_noise((48, 40), 30 + 20 * i).convert("RGB"))).decode()
             for i in range(4)]
    big = base64.b64encode(_png(Image.new("RGB", (6000, 6000), (10, 120, 200)))).decode()
    return small, [big] * 3


PICTURES, OVERSIZE = [], []
CHAIN = 4  # turns a client chains with previous_response_id before it starts a new conversation
CACHE_RAM_MIB = 256  # OLLAPY_CACHE_RAM of the server started here


CACHE_GAUGES = {"cache_ram": "ollapy_prompt_cache_bytes", "restore_buf": "ollapy_prompt_cache_restore_buffer_bytes",
                "queued": "ollapy_prompt_cache_queued_bytes"}


def sample_process(pid: int) -> dict:
    """RSS (bytes; ``anon`` and ``file`` its anonymous and file-backed parts), open file descriptors and threads of
    process ``pid`` (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kib = {k: int(fields[v].split()[0]) * 1024 if v in fields else 0
           for k, v in (("rss", "VmRSS"), ("anon", "RssAnon"), ("file", "RssFile"))}
    return {**kib, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(fields["Threads"])}


def parse_cache_gauges(text: str) -> dict:
    """The prompt cache's bytes in a ``/metrics`` text, summed over models: ``cache_ram`` (the RAM tier),
    ``restore_buf`` (the restore buffer), ``queued`` (the disk writer's queue); 0 for a gauge not shown."""
    out = dict.fromkeys(CACHE_GAUGES, 0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, metric in CACHE_GAUGES.items():
            if name == metric and (key != "cache_ram" or 'tier="ram"' in line):
                out[key] += int(float(line.rsplit(" ", 1)[1]))
    return out


async def sample_server(pid: int, http: httpx.AsyncClient | None) -> dict:
    """:func:`sample_process` of ``pid`` and the cache gauges of its ``/metrics`` read right after (zeros when
    ``http`` is None or /metrics does not answer)."""
    out = sample_process(pid)
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            out["maps"] = sum(1 for _ in f)
    except OSError:
        out["maps"] = 0
    gauges = dict.fromkeys(CACHE_GAUGES, 0)
    if http is not None:
        try:
            gauges = parse_cache_gauges((await http.get("/metrics")).text)
        except (httpx.HTTPError, ValueError):
            pass
    return {**out, **gauges}


def cache_held(sample: dict) -> int:
    """Bytes of a sample's RSS that the bounded prompt-cache structures account for (RAM tier, restore buffer,
    writer queue)."""
    return sample["cache_ram"] + sample["restore_buf"] + sample["queued"]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation (statistics' inclusive method)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


class Tally:
    """Counts per kind, errors (with the first few messages), 503s and times to first token."""

    def __init__(self) -> None:
        self.done = {k: 0 for k in KINDS}
        self.errors: list[str] = []
        self.n_errors = 0
        self.busy = 0
        self.t0 = time.monotonic()  # the clients' start (errors are reported with their time)
        self.busy_why: collections.Counter = collections.Counter()  # (kind, the 503's message) -> count
        self.ttft: list[float] = []
        self.switches: list[str] = []  # the loaded model each time /api/ps showed another one
        self.timeline: list[dict] = []  # samples of the server's memory and cache gauges (see sample_server)
        self.phase_log: list[str] = []  # the model switches (ModelPhase.log)

    def error(self, kind: str, what: str) -> None:
        self.n_errors += 1
        if len(self.errors) < 5:
            self.errors.append(f"{kind} at {time.monotonic() - self.t0:.0f} s: {what[:200]}")


async def busy_wait(tally: Tally, r: httpx.Response, kind: str) -> None:
    """A 503 "busy" answer (documented): counted apart with its reason (the error's message, numbers left out),
    then the client waits ``Retry-After`` as SDKs do."""
    tally.busy += 1
    text = (await r.aread()).decode(errors="replace")
    try:
        err = json.loads(text).get("error", text)
        text = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        pass
    tally.busy_why[(kind, "".join("#" if c.isdigit() else c for c in text)[:90])] += 1
    await asyncio.sleep(float(r.headers.get("retry-after", "1") or 1))


async def one_request(http: httpx.AsyncClient, model: str, kind: str, tally: Tally, rng: random.Random,
                      chain: list[str]) -> None:
    """Send one request of ``kind`` and record its outcome (``chain``: this client's stored Responses turns)."""
    q = rng.choice(QUESTIONS)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
    opts = {"temperature": 0, "num_predict": rng.randint(8, 32)}
    t0 = time.perf_counter()
    kind_stream = kind == "anthropic" and rng.random() < 0.5  # half of Anthropic's requests are streamed
    if kind in ("image", "oversize") and model != VISION_MODEL:
        kind = "chat"  # the second model has no projector: a text chat instead (counted as one)
    if kind == "oversize":  # an intended 400: over OLLAPY_REQUEST_IMAGE_PIXELS, refused from the headers
        r = await http.post("/api/chat", json={"model": model, "stream": False, "options": opts, "messages": [
            {"role": "user", "content": q, "images": OVERSIZE}]})
        if r.status_code in (503, 529):
            await busy_wait(tally, r, kind)
        elif r.status_code == 400 and "OLLAPY_REQUEST_IMAGE_PIXELS" in r.text:
            tally.done[kind] += 1
        else:
            tally.error(kind, f"HTTP {r.status_code} {r.text} (expected a 400 over the pixel budget)")
        return
    if kind in ("chat", "generate", "embed", "responses", "image", "tools") or (kind == "anthropic" and not kind_stream):
        if kind == "responses" and len(chain) >= CHAIN:
            chain.clear()
        path, body = {
            "chat": ("/api/chat", {"model": model, "stream": False, "messages": msgs, "options": opts}),
            "generate": ("/api/generate", {"model": model, "stream": False, "prompt": q, "system": SYSTEM,
                                           "options": opts}),
            "embed": ("/api/embed", {"model": model, "input": [q, rng.choice(QUESTIONS)]}),
            "image": ("/api/chat", {"model": model, "stream": False, "options": opts, "messages": [
                msgs[0], {"role": "user", "content": "Describe the picture.", "images": [rng.choice(PICTURES)]}]}),
            "tools": ("/v1/chat/completions", {"model": model, "messages": msgs[:1] + [
                {"role": "user", "content": f"What is the weather in {rng.choice(['Paris', 'Oslo', 'Lima'])}?"}],
                "tools": TOOLS, "temperature": 0, "max_tokens": opts["num_predict"]}),
            "anthropic": ("/v1/messages", {"model": model, "max_tokens": opts["num_predict"], "system": SYSTEM,
                                           "messages": msgs[1:], "temperature": 0}),
            "responses": ("/v1/responses", {"model": model, "input": q, "instructions": SYSTEM, "store": True,
                                            "max_output_tokens": opts["num_predict"], "temperature": 0,
                                            **({"previous_response_id": chain[-1]} if chain else {})}),
        }[kind]
        r = await http.post(path, json=body)
        if r.status_code in (503, 529):  # 529: Anthropic's "overloaded", ollapy's 503 busy
            await busy_wait(tally, r, kind)
            if kind == "responses":
                chain.clear()  # the previous turn may belong to the other model's phase
        elif r.status_code != 200:
            tally.error(kind, f"HTTP {r.status_code} {r.text}")
        else:
            tally.done[kind] += 1
            if kind == "responses":
                chain.append(r.json()["id"])
        return
    if kind == "anthropic":
        path, body = "/v1/messages", {"model": model, "max_tokens": opts["num_predict"], "system": SYSTEM,
                                      "messages": msgs[1:], "temperature": 0, "stream": True}
        async with http.stream("POST", path, json=body) as r:
            if r.status_code in (503, 529):
                await busy_wait(tally, r, kind)
                return
            if r.status_code != 200:
                tally.error(kind, f"HTTP {r.status_code} {(await r.aread()).decode(errors='replace')}")
                return
            first, stopped = True, False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                obj = json.loads(line[6:])
                if obj.get("type") == "error":
                    tally.error(kind, json.dumps(obj.get("error")))
                    return
                if first and obj.get("type") == "content_block_delta":
                    first = False
                    tally.ttft.append(time.perf_counter() - t0)
                stopped = stopped or obj.get("type") == "message_stop"
            if not stopped:
                tally.error(kind, "stream ended without message_stop")
                return
        tally.done[kind] += 1
        return
    if kind == "v1_stream" or (kind == "cancelled" and rng.random() < 0.5):
        path, body = "/v1/chat/completions", {"model": model, "stream": True, "messages": msgs, "temperature": 0,
                                              "max_tokens": opts["num_predict"]}
    else:
        path, body = "/api/chat", {"model": model, "stream": True, "messages": msgs, "options": opts}
    async with http.stream("POST", path, json=body) as r:
        if r.status_code == 503:
            await busy_wait(tally, r, kind)
            return
        if r.status_code != 200:
            tally.error(kind, f"HTTP {r.status_code} {(await r.aread()).decode(errors='replace')}")
            return
        first = True
        async for line in r.aiter_lines():
            line = line.removeprefix("data: ").strip()
            if not line or line == "[DONE]":
                continue
            obj = json.loads(line)
            if "error" in obj:
                tally.error(kind, json.dumps(obj["error"]))
                return
            if first:
                first = False
                tally.ttft.append(time.perf_counter() - t0)
                if kind == "cancelled":
                    break  # leaving the block closes the connection: the server cancels the request
    tally.done[kind] += 1


class ModelPhase:
    """The model the clients ask for now, and whether they may send (cleared while :func:`switch_model` swaps
    the loaded model: the clients hold their next request, as users of a one-model server wait for a swap)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.ready = asyncio.Event()
        self.ready.set()
        self.log: list[str] = []  # one line per switch: when, to what, how long the clients were held

    async def wait_ready(self, stop_at: float) -> bool:
        """Wait until the clients may send again; False when ``stop_at`` (time.monotonic()) comes first."""
        if self.ready.is_set():
            return True
        try:
            await asyncio.wait_for(self.ready.wait(), max(0.0, stop_at - time.monotonic()))
        except asyncio.TimeoutError:
            return False
        return True


async def switch_model(url: str, phase: ModelPhase, new: str, tally: Tally, start: float, stop_at: float) -> bool:
    """Swap the loaded model for ``new`` as Ollama's clients do with one model allowed: hold the clients' next
    requests, ask for the old model's unload (``keep_alive: 0`` with an empty prompt: it unloads once its requests
    in flight and queued end), then load ``new`` (an empty prompt), sent again after ``Retry-After`` while the old
    one still holds the room (503, counted as "switch"); then the clients go on with ``new``. Returns whether
    ``new`` was loaded before ``stop_at``."""
    old = phase.model
    phase.ready.clear()
    t0 = time.monotonic()
    tries = 0
    loaded = False
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=10), limits=CLIENT_LIMITS,
                                 trust_env=False) as http:
        while time.monotonic() < stop_at:
            try:
                r = await http.post("/api/generate", json={"model": old, "keep_alive": 0})  # Ollama's unload
                if r.status_code != 200 or r.json().get("done_reason") != "unload":
                    tally.error("switch", f"unload of {old}: HTTP {r.status_code} {r.text}")
                tries += 1
                r = await http.post("/api/generate", json={"model": new})  # Ollama's load
            except (httpx.HTTPError, ValueError) as exc:
                tally.error("switch", f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(1)
                continue
            if r.status_code == 200:
                loaded = True
                break
            if r.status_code == 503:
                await busy_wait(tally, r, "switch")
            else:
                tally.error("switch", f"load of {new}: HTTP {r.status_code} {r.text}")
                await asyncio.sleep(1)
    phase.model = new
    phase.ready.set()
    phase.log.append(f"{old} -> {new} at {t0 - start:.0f} s: clients held {time.monotonic() - t0:.1f} s "
                     f"({tries} load tries){'' if loaded else ' (NOT loaded before the end)'}")
    return loaded


async def run_switches(url: str, phase: ModelPhase, first: str, second: str, tally: Tally, start: float,
                       seconds: float, stop_at: float) -> None:
    """The second-model phase: at 40% of the run switch to ``second``; once it has served a tenth of the run (55%
    of the run at the latest), back to ``first``, so that the first and last windows judged flat both run on
    ``first``."""
    await asyncio.sleep(max(0.0, start + 0.4 * seconds - time.monotonic()))
    if not await switch_model(url, phase, second, tally, start, stop_at):
        return
    back_at = min(time.monotonic() + seconds / 10, start + 0.55 * seconds)
    await asyncio.sleep(max(0.0, back_at - time.monotonic()))
    await switch_model(url, phase, first, tally, start, stop_at)


async def client_loop(url: str, phase: ModelPhase, seed: int, stop_at: float, tally: Tally) -> None:
    """One client: requests of random kinds until ``stop_at`` (time.monotonic()), to the model ``phase`` names
    (held while it switches models)."""
    rng = random.Random(seed)
    chain: list[str] = []
    chain_model = phase.model
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=10), limits=CLIENT_LIMITS,
                                 trust_env=False) as http:
        while time.monotonic() < stop_at:
            if not await phase.wait_ready(stop_at):
                break
            kind = rng.choice(KINDS)
            if phase.model != chain_model:  # a Responses chain stays on one model
                chain.clear()
                chain_model = phase.model
            try:
                await one_request(http, phase.model, kind, tally, rng, chain)
            except (httpx.HTTPError, ValueError) as exc:
                tally.error(kind, f"{type(exc).__name__}: {exc}")


async def watch_loaded(url: str, stop_at: float, tally: Tally) -> None:
    """Record each change of the loaded model(s) that ``/api/ps`` shows, once a second."""
    last = None
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=CLIENT_LIMITS, trust_env=False) as http:
        while time.monotonic() < stop_at:
            try:
                names = ",".join(sorted(m["name"] for m in (await http.get("/api/ps")).json()["models"]))
            except (httpx.HTTPError, ValueError, KeyError):
                names = last
            if names != last and names:
                tally.switches.append(names)
                last = names
            await asyncio.sleep(1)


def install_vision_model(models: Path, gguf: Path, projector: Path, name: str) -> None:
    """A manifest for ``name``: ``gguf`` plus ``projector`` (Ollama's projector layer) and ``repeat_penalty`` 1,
    blobs linked (the same layout tests/test_vision_server.py writes)."""
    import hashlib

    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    params = models / "soak-params.json"
    params.write_text(json.dumps({"repeat_penalty": 1}))
    layers = []
    for path, mt in ((gguf, "application/vnd.ollama.image.model"),
                     (projector, "application/vnd.ollama.image.projector"),
                     (params, "application/vnd.ollama.image.params")):
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        blob = blobs / f"sha256-{sha}"
        if not blob.exists():
            os.symlink(path, blob)
        layers.append({"mediaType": mt, "digest": f"sha256:{sha}", "size": path.stat().st_size})
    man = models / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
    man.parent.mkdir(parents=True, exist_ok=True)
    man.write_text(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                          "digest": "sha256:" + "0" * 64, "size": 2}, "layers": layers}))


def start_server(slots: int, gguf: Path, base: Path, nofile: int = 0, port: int = 0,
                 create: bool = True) -> tuple[subprocess.Popen, str]:
    """``ollapy serve`` on a free loopback port (or ``port``) with its own store and cache under ``base``, under
    ``ulimit -n nofile`` (soft and hard; 0 leaves the limit alone); with ``create``, ``soak`` is installed from
    ``gguf`` plus a synthetic projector and ``soak-b`` created from ``gguf``; returns (process, url) once it
    answers."""
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    if create:
        sys.path.insert(0, str(ROOT / "scripts"))
        import make_test_vlm

        proj = make_test_vlm.write_projector(base / "mmproj-soak.gguf", "gemma3", 0, 576)
        install_vision_model(base / "models", gguf, proj, VISION_MODEL)

    def limit() -> None:
        if nofile:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL=str(slots),
               OLLAPY_MODELS=str(base / "models"), OLLAPY_CACHE_DIR=str(base / "cache"), OLLAPY_CACHE_RAM=f"{CACHE_RAM_MIB}MiB",
               OLLAPY_CONTEXT_LENGTH="1024", OLLAPY_KEEP_ALIVE="-1", OLLAPY_MAX_LOADED_MODELS="1")
    env.pop("OLLAPY_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve", "--allow-paths"], env=env, cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=open(base / "serve.log", "ab"), preexec_fn=limit)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise SystemExit(f"ollapy serve exited with {proc.returncode}; see {base / 'serve.log'}") from None
            time.sleep(0.2)
    mf = f"FROM {gguf}\nPARAMETER repeat_penalty 1\n"
    for name in ("soak-b",) if create else ():  # loaded under traffic (one model at a time)
        r = httpx.post(url + "/api/create", json={"model": name, "modelfile": mf, "stream": False}, timeout=300)
        if r.status_code != 200:
            raise SystemExit(f"could not create the soak model {name}: {r.text}")
    return proc, url


def server_log_problems(path: Path) -> list[str]:
    """The lines of the server's log (its stderr) that report a warning, an error or a traceback."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if any(w in ln for w in ("WARNING", "ERROR", "Traceback", "Error", "CRITICAL"))]


def disk_hits(url: str) -> int:
    """Prompt-cache hits from the disk tier that ``/metrics`` counts (all models)."""
    n = 0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("ollapy_prompt_cache_hits") and 'tier="disk"' in line:
            n += int(float(line.rsplit(" ", 1)[1]))
    return n


def restart_for_restores(proc: subprocess.Popen, url: str, slots: int, gguf: Path, base: Path,
                         nofile: int) -> tuple[subprocess.Popen, str]:
    """Write the prompt cache (the soak's system prompt, with and without a picture, on both models' file), stop
    the server (its cache drained to disk) and start it again on the same port and directories: the measured run
    begins with restores from disk."""
    for model, images in (("soak", []), ("soak", PICTURES[:1]), ("soak-b", [])):
        for q in QUESTIONS[:2]:
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q,
                                                             **({"images": images} if images else {})}]
            r = httpx.post(url + "/api/chat", json={"model": model, "stream": False, "messages": msgs,
                                                     "options": {"temperature": 0, "num_predict": 4}}, timeout=600)
            if r.status_code != 200:
                raise SystemExit(f"warm-up request failed: {r.text}")
    proc.terminate()
    proc.wait(timeout=300)
    return start_server(slots, gguf, base, nofile, port=int(url.rsplit(":", 1)[1]), create=False)


def default_model() -> Path:
    """The SmolLM2 test model (scripts/fetch_test_models.py fetches it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import fetch_test_models as f

    m = next(m for m in f.MODELS if m.name == "smollm2")
    return f.default_dir() / m.filename


def server_pid(url: str) -> int:
    """The pid listening on ``url``'s port (from /proc/net/tcp and the fds of this user's processes)."""
    port = int(url.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                inodes.add(parts[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    raise SystemExit(f"no process of this user listens on port {port}")


def warmup_s(seconds: float) -> float:
    """Seconds of a run of ``seconds`` before the server is first sampled for the judgement (slots filling)."""
    return min(60.0, max(15.0, seconds / 10))


async def soak(url: str, model: str, clients: int, seconds: float, pid: int,
               second: str | None = None) -> tuple[Tally, dict, dict]:
    """Run the clients (asking for ``second`` in the second-model phase, when given); sample the server after the
    warm-up and after the load."""
    tally = Tally()
    start = tally.t0 = time.monotonic()
    stop_at = start + seconds
    warmup = warmup_s(seconds)

    phase = ModelPhase(model)

    def model_at() -> str:
        """The model the clients ask for now (``(switch)`` while they are held for a swap)."""
        return phase.model if phase.ready.is_set() else "(switch)"

    async def timeline_row(http: httpx.AsyncClient, asked: str) -> dict:
        """A sample of the server (:func:`sample_server`) with the time, the model asked for and those loaded."""
        row = await sample_server(pid, http)
        try:
            loaded = ",".join(sorted(m["name"].removesuffix(":latest") for m in (await http.get("/api/ps")).json()["models"]))
        except (httpx.HTTPError, ValueError, KeyError):
            loaded = "?"
        return {"t": time.monotonic() - start, "asked": asked, "loaded": loaded, **row}

    async def watch_memory(http: httpx.AsyncClient) -> None:
        """Sample the server every ``every`` s into ``tally.timeline`` until the clients stop."""
        while time.monotonic() < stop_at:
            tally.timeline.append(await timeline_row(http, model_at()))
            await asyncio.sleep(every)

    every = SAMPLE_EVERY_S
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=CLIENT_LIMITS, trust_env=False) as http:
        tasks = [asyncio.create_task(client_loop(url, phase, i, stop_at, tally)) for i in range(clients)]
        if second:
            tasks.append(asyncio.create_task(run_switches(url, phase, model, second, tally, start, seconds, stop_at)))
        tasks.append(asyncio.create_task(watch_loaded(url, stop_at, tally)))
        tasks.append(asyncio.create_task(watch_memory(http)))
        await asyncio.sleep(warmup)
        first = await sample_server(pid, http)
        await asyncio.gather(*tasks)
        tally.timeline.append(await timeline_row(http, "(idle)"))
        await asyncio.sleep(12)  # cancelled requests' slots freed, the cache writer drained, idle pool workers gone
        last = await sample_server(pid, http)
        tally.timeline.append(await timeline_row(http, "(end)"))
    tally.phase_log = phase.log
    return tally, first, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the clients run (default 10)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    ap.add_argument("--slots", type=int, default=4, help="OLLAPY_NUM_PARALLEL of the server it starts (default 4)")
    ap.add_argument("--url", help="soak a running server instead (give --model too)")
    ap.add_argument("--model", help="model name on --url, or a GGUF path for the server it starts")
    ap.add_argument("--no-swap", action="store_true", help="no second-model phase (to tell its memory apart)")
    ap.add_argument("--nofile", type=int, default=512,
                    help="ulimit -n (soft and hard) of the server it starts (default 512; 0: leave it)")
    args = ap.parse_args()
    proc = None
    restored = -1
    log_problems: list[str] = []
    PICTURES[:], OVERSIZE[:] = make_pictures()
    tmp = tempfile.TemporaryDirectory(prefix="ollapy-soak-")
    try:
        if args.url:
            url, model = args.url.rstrip("/"), args.model or "smollm2:135m"
        else:
            gguf = Path(args.model) if args.model else default_model()
            proc, url = start_server(args.slots, gguf, Path(tmp.name), args.nofile)
            proc, url = restart_for_restores(proc, url, args.slots, gguf, Path(tmp.name), args.nofile)
            model = "soak"
        pid = proc.pid if proc else server_pid(url)
        r = httpx.post(url + "/api/generate", json={"model": model, "prompt": "Hi", "stream": False,
                                                    "options": {"num_predict": 1}}, timeout=600)
        if r.status_code != 200:
            raise SystemExit(f"the model does not answer: {r.text}")
        print(f"soak: {args.clients} clients, {args.minutes:g} min, server pid {pid} at {url}, model {model}",
              flush=True)
        tally, first, last = asyncio.run(soak(url, model, args.clients, args.minutes * 60, pid,
                                              None if args.url or args.no_swap else "soak-b"))
        restored = disk_hits(url)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
            log_problems = server_log_problems(Path(tmp.name) / "serve.log")
        tmp.cleanup()
    mib = 1024 * 1024
    total = sum(tally.done.values())
    print("requests: " + ", ".join(f"{k} {v}" for k, v in tally.done.items()) + f" (total {total}, "
          f"{total / (args.minutes * 60):.1f}/s); 503 busy: {tally.busy} ({total / max(1, total + tally.busy):.0%} "
          f"of the answers were served)")
    for (kind, why), n in tally.busy_why.most_common(6):
        print(f"  503 {n:5d} x {kind}: {why}")
    print(f"server at start (after warm-up): RSS {first['rss'] / mib:.0f} MiB (prompt cache "
          f"{cache_held(first) / mib:.0f} MiB of it), fds {first['fds']}, "
          f"threads {first['threads']}")
    print(f"server at end:                   RSS {last['rss'] / mib:.0f} MiB (prompt cache "
          f"{cache_held(last) / mib:.0f} MiB of it), fds {last['fds']}, "
          f"threads {last['threads']}")
    print(f"TTFT of {len(tally.ttft)} streams (slot wait included): p50 {percentile(tally.ttft, 0.5):.2f} s, "
          f"p99 {percentile(tally.ttft, 0.99):.2f} s")
    print(f"server log: {len(log_problems)} warning/error/traceback lines" + "".join(
        f"\n  {line[:160]}" for line in log_problems[:12]))
    print("loaded models seen in /api/ps, in order: " + " -> ".join(tally.switches))
    for line in tally.phase_log:
        print("  switch " + line)
    print("memory timeline (MiB; cache = prompt-cache RAM tier + restore buffer + writer queue, from /metrics):")
    print("     t  asked    loaded      RSS   anon   file  cache  RSS-cache   fds  thr   maps")
    for row in tally.timeline:
        print(f"{row['t']:6.0f}  {row['asked'][:7]:7}  {row['loaded'][:8]:8}  {row['rss'] / mib:6.0f} "
              f"{row['anon'] / mib:6.0f} {row['file'] / mib:6.0f} {cache_held(row) / mib:6.0f}  "
              f"{(row['rss'] - cache_held(row)) / mib:8.0f}  {row['fds']:4d} {row['threads']:4d} {row['maps']:6d}")
    print("curves, per-minute means of the samples (MiB for RSS net of the prompt cache):")
    print("   min  samples  asked      fds   threads     maps  RSS-cache")
    minutes: dict[int, list[dict]] = {}
    for row in tally.timeline:
        if row["asked"] not in ("(idle)", "(end)"):
            minutes.setdefault(int(row["t"] // 60), []).append(row)
    for m, group in sorted(minutes.items()):
        asked = "/".join(sorted({r["asked"] for r in group}))
        print(f"{m:6d}  {len(group):7d}  {asked[:9]:9} " + "".join(
            f"{statistics.fmean(r[k] for r in group):8.1f}  " for k in ("fds", "threads", "maps"))
            + f"{statistics.fmean(r['rss'] - cache_held(r) for r in group) / mib:8.1f}")
    rows = tally.timeline + [first, last]
    ram_peak = max(r["cache_ram"] for r in rows)

    def net(sample: dict) -> int:
        """RSS less the bounded prompt-cache bytes /metrics showed at the same moment (judged apart)."""
        return sample["rss"] - cache_held(sample)

    run_s = args.minutes * 60
    warm = warmup_s(run_s)
    window = min(FLAT_WINDOW_S, (run_s - warm) / 3)
    loaded_rows = [r for r in tally.timeline if r["asked"] not in ("(idle)", "(end)")]
    head = [r for r in loaded_rows if warm <= r["t"] <= warm + window]  # after the warm-up, as `first` is
    tail = [r for r in loaded_rows if r["t"] >= run_s - window]

    def flat(key: str, what: str, value=lambda r, k: r[k]) -> tuple[bool, str]:
        """First vs last window's mean of ``key`` within FLAT_TOLERANCE."""
        if not head or not tail:
            return False, f"{what} flat: too few samples ({len(head)}, {len(tail)})"
        a = statistics.fmean(value(r, key) for r in head)
        b = statistics.fmean(value(r, key) for r in tail)
        scale = mib if key == "rss" else 1
        ok = b <= a * (1 + FLAT_TOLERANCE) or b - a <= (1 if key != "rss" else 0)
        return ok, (f"{what} flat, first vs last {window / 60:.1f} min ({len(head)} and {len(tail)} samples every "
                    f"{SAMPLE_EVERY_S:.0f} s): mean {a / scale:.1f} -> {b / scale:.1f} ({(b / a - 1) * 100:+.1f}%, "
                    f"target at most +{FLAT_TOLERANCE * 100:.0f}%)")

    checks = [flat("fds", "open fds"), flat("threads", "threads"), flat("maps", "memory mappings"),
              flat("rss", "RSS net of the prompt cache (MiB)", lambda r, k: net(r)),
              (args.url is not None or restored > 0,
               f"prompt-cache restores from disk after the restart: {restored} disk hits (target > 0)"),
              (args.url is not None or args.nofile == 0 or first["fds"] < args.nofile,
               f"served under ulimit -n {args.nofile}: {max(r['fds'] for r in rows)} fds at most")]
    checks += [
        (tally.n_errors == 0, f"errors: {tally.n_errors} (target 0; 503 busy apart: {tally.busy})"
         + (f"; first: {tally.errors}" if tally.errors else "")),
        (last["fds"] - first["fds"] <= 8, f"open fds flat: {first['fds']} -> {last['fds']} (target at most +8)"),
        (last["threads"] - first["threads"] <= 8,
         f"threads flat: {first['threads']} -> {last['threads']} (target at most +8: worker pools)"),
        (net(last) <= net(first) * 1.10 + 64 * mib,
         f"RSS bounded, net of the prompt cache: {net(first) / mib:.0f} -> {net(last) / mib:.0f} MiB (target at most "
         f"+10% + 64 MiB; RSS {first['rss'] / mib:.0f} -> {last['rss'] / mib:.0f} MiB)"),
        (args.url is not None or ram_peak <= CACHE_RAM_MIB * mib,
         f"prompt-cache RAM tier within OLLAPY_CACHE_RAM: at most {ram_peak / mib:.0f} MiB seen (bound "
         f"{CACHE_RAM_MIB} MiB); restore buffer at most {max(r['restore_buf'] for r in rows) / mib:.0f} MiB"),
        (args.url is not None or args.no_swap or len(tally.switches) >= 3,
         f"second model loaded under traffic and back: {len(tally.switches) - 1} switches (target at least 2)"),
        (all(tally.done.values()), "every kind of request answered: " + ", ".join(
            k for k, v in tally.done.items() if v) + (" (missing: " + ", ".join(
                k for k, v in tally.done.items() if not v) + ")" if not all(tally.done.values()) else "")),
    ]
    for ok, text in checks:
        print(("ok      " if ok else "MISSED  ") + text)
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
