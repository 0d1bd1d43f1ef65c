#!/usr/bin/env python
"""Benchmark ``ollapy serve`` with N concurrent streaming clients (shared system prompt + short questions).

Starts a server (OLLAPY_NUM_PARALLEL=4) on a free loopback port with a
temporary store/cache, then for each concurrency level (default 1, 4, 16)
sends ``--requests`` chats and reports p50/p99 time to first token,
inter-token latency, aggregate generated tokens/s and the prompt-cache hit
rate (share of prompt tokens served from cache). It also reports TTFT of
the first (uncached) request vs cached ones. When ``llama-server`` is on PATH
(``scripts/build_native_baselines.sh`` builds it from the same llama.cpp
version), the same load runs against it (``-np 4``, same threads, same CPU
choices) through the OpenAI API, which ollapy also serves, and the
aggregate tokens/s are compared. Targets (issue 6): aggregate tokens/s at 4
and 16 clients >= 0.9x llama-server; cached-prefix TTFT <= 1/5 of uncached.

    python scripts/bench_server.py --model ~/.cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ("You are a concise geography tutor. Answer every question about countries, capitals, rivers and "
          "mountains in one short sentence. Be accurate, friendly and avoid lists. " * 4).strip()
QUESTIONS = ["What is the capital of France?", "What is the capital of Japan?", "Which river flows through Cairo?",
             "What is the highest mountain in Africa?", "What is the capital of Canada?", "Where is the Danube?",
             "What is the capital of Peru?", "Which country has Lake Titicaca?", "What is the capital of Kenya?",
             "Where is Mount Fuji?", "What is the capital of Norway?", "Which sea borders Greece?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def new_client(base: str, clients: int) -> httpx.AsyncClient:
    """One connection per request, for both servers: llama-server (cpp-httplib) drops a kept-alive connection
    after a streamed answer now and then ("Server disconnected without sending a response"); on loopback a
    new connection costs well under a millisecond."""
    return httpx.AsyncClient(base_url=base, timeout=600,
                             limits=httpx.Limits(max_connections=clients + 4, max_keepalive_connections=0))


async def one_ollama(client: httpx.AsyncClient, model: str, q: str, num_predict: int) -> dict:
    body = {"model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "options": {"temperature": 0, "num_predict": num_predict}}
    t0 = time.perf_counter()
    times, final = [], None
    async with client.stream("POST", "/api/chat", json=body) as r:
        async for line in r.aiter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if obj.get("done"):
                final = obj
            elif obj.get("message", {}).get("content"):
                times.append(time.perf_counter())
    return {"t0": t0, "times": times, "end": time.perf_counter(), "tokens": (final or {}).get("eval_count", len(times)),
            "prompt": (final or {}).get("prompt_eval_count", 0), "cached": (final or {}).get("prompt_cache_tokens", 0)}


async def one_openai(client: httpx.AsyncClient, model: str, q: str, num_predict: int) -> dict:
    body = {"model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "temperature": 0, "max_tokens": num_predict, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times, usage = [], {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    times.append(time.perf_counter())
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {"t0": t0, "times": times, "end": time.perf_counter(), "tokens": usage.get("completion_tokens", len(times)),
            "prompt": usage.get("prompt_tokens", 0), "cached": cached}


async def run_level(base: str, model: str, clients: int, requests: int, num_predict: int, api: str) -> dict:
    fn = one_ollama if api == "ollama" else one_openai
    queue = list(range(requests))
    results: list[dict] = []
    async with new_client(base, clients) as client:
        async def worker():
            while queue:
                i = queue.pop()
                results.append(await fn(client, model, QUESTIONS[i % len(QUESTIONS)], num_predict))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ttft = [r["times"][0] - r["t0"] for r in results if r["times"]]
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    toks = sum(r["tokens"] for r in results)
    prompt = sum(r["prompt"] for r in results)
    cached = sum(r["cached"] for r in results)
    return {"clients": clients, "requests": len(results), "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99), "tok_s": toks / wall if wall else 0.0,
            "hit": cached / prompt if prompt else 0.0, "wall": wall}


def start_ollapy(model: str, port: int, tmp: Path, num_ctx: int, threads: int) -> subprocess.Popen:
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL="4", OLLAPY_CONTEXT_LENGTH=str(num_ctx),
               OLLAPY_NUM_THREAD=str(threads),
               OLLAPY_MODELS=str(tmp / "models"), OLLAPY_CACHE_DIR=str(tmp / "cache"), OLLAPY_KEEP_ALIVE="-1")
    env.pop("OLLAPY_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve"], env=env, cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "serve.log", "wb"))


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("server did not start")


def table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}")
    print(f"{'clients':>7} {'reqs':>5} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'tok/s':>7} {'cache hit':>9}")
    for r in rows:
        print(f"{r['clients']:>7} {r['requests']:>5} {r['ttft_p50'] * 1000:>7.0f}ms {r['ttft_p99'] * 1000:>7.0f}ms "
              f"{r['itl_p50'] * 1000:>6.1f}ms {r['itl_p99'] * 1000:>6.1f}ms {r['tok_s']:>7.1f} {r['hit'] * 100:>8.0f}%")


async def cached_vs_uncached(base: str, model: str, num_predict: int, api: str) -> tuple[float, float]:
    """TTFT of a never-seen system prompt vs the same prefix again (one client)."""
    fn = one_ollama if api == "ollama" else one_openai
    global SYSTEM
    saved = SYSTEM
    SYSTEM = f"[session {time.time_ns()}] " + saved
    try:
        async with new_client(base, 1) as client:
            first = await fn(client, model, QUESTIONS[0], num_predict)
            again = [await fn(client, model, q, num_predict) for q in QUESTIONS[1:4]]
    finally:
        SYSTEM = saved
    unc = first["times"][0] - first["t0"] if first["times"] else float("nan")
    cac = statistics.median(r["times"][0] - r["t0"] for r in again if r["times"])
    return unc, cac


def start_llama_server(exe: str, model: str, port: int, tmp: Path, num_ctx: int, threads: int) -> subprocess.Popen:
    """Native llama-server with the settings ollapy serve uses: 4 slots of num_ctx, same threads, flash
    attention off on the CPU, weight repacking as ollapy chooses it for this CPU (off on AMX: it crashes)."""
    sys.path.insert(0, str(ROOT))
    from ollapy.engine.backend.bindings import choose_extra_bufts

    cmd = [exe, "-m", model, "--port", str(port), "--host", "127.0.0.1", "-np", "4", "-c", str(num_ctx * 4),
           "-t", str(threads), "-fa", "off"]
    if not choose_extra_bufts("auto")[0]:
        cmd.append("--no-repack")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "llama-server.log", "wb"))


def wait_native(base: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("llama-server did not start")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def level(base: str, model: str, clients: int, args, api: str) -> dict:
    return asyncio.run(run_level(base, model, clients, max(args.requests, clients), args.num_predict, api))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--num-predict", type=int, default=32)
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="decode threads of both servers")
    ap.add_argument("--rounds", type=int, default=3, help="alternating ollapy/llama-server rounds per level")
    ap.add_argument("--url", help="benchmark an already running ollapy serve instead of starting one")
    ap.add_argument("--llama-server", help="llama-server executable (default: from PATH)")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ollapy-bench-"))
    exe = args.llama_server or shutil.which("llama-server")
    procs: list[subprocess.Popen] = []
    try:
        if args.url:
            base = args.url.rstrip("/")
        else:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            procs.append(start_ollapy(args.model, port, tmp, args.num_ctx, args.threads))
            wait_up(base, procs[-1])
        httpx.post(base + "/api/generate", json={"model": args.model}, timeout=600)  # load
        nbase = None
        if exe is not None:  # both servers stay up; an idle one sleeps, so they take turns on the same machine
            nport = free_port()
            nbase = f"http://127.0.0.1:{nport}"
            procs.append(start_llama_server(exe, args.model, nport, tmp, args.num_ctx, args.threads))
            wait_native(nbase, procs[-1], tmp / "llama-server.log")
        unc, cac = asyncio.run(cached_vs_uncached(base, args.model, args.num_predict, "ollama"))
        ollama_rows = [level(base, args.model, c, args, "ollama") for c in levels]
        if nbase is not None:
            nunc, ncac = asyncio.run(cached_vs_uncached(nbase, args.model, args.num_predict, "openai"))
            ours: dict[int, list[dict]] = {c: [] for c in levels}
            native: dict[int, list[dict]] = {c: [] for c in levels}
            for r in range(args.rounds):
                for c in levels:
                    for who in (("ours", "native") if r % 2 == 0 else ("native", "ours")):
                        if who == "ours":
                            ours[c].append(level(base, args.model, c, args, "openai"))
                        else:
                            native[c].append(level(nbase, args.model, c, args, "openai"))
    finally:
        for p in procs:
            stop(p)
    print(f"ollapy serve (n_parallel 4, num_ctx {args.num_ctx}, num_predict {args.num_predict}, "
          f"threads {args.threads}), model {Path(args.model).name}")
    ok = cac / unc <= 0.2
    print(f"TTFT shared prefix: uncached {unc * 1000:.0f} ms, cached p50 {cac * 1000:.0f} ms "
          f"(ratio {cac / unc:.2f}, target <= 0.2 {'ok' if ok else 'MISSED'})")
    table("ollapy serve, Ollama API (/api/chat)", ollama_rows)
    if nbase is None:
        print("\nllama-server: not found (scripts/build_native_baselines.sh builds it; put it on PATH)")
        return 0 if ok else 1
    table("ollapy serve, OpenAI API (/v1/chat/completions), first round", [ours[c][0] for c in levels])
    print(f"\nllama-server TTFT shared prefix: uncached {nunc * 1000:.0f} ms, cached p50 {ncac * 1000:.0f} ms")
    table(f"llama-server -np 4 ({exe}), OpenAI API, first round", [native[c][0] for c in levels])
    print(f"\naggregate tokens/s, ollapy /v1 vs llama-server /v1 (same client and load; {args.rounds} alternating "
          "rounds: medians, and the median of the per-round ratios)")
    print(f"{'clients':>7} {'ollapy':>8} {'native':>8} {'ratio':>6}  target")
    for c in levels:
        o = statistics.median(x["tok_s"] for x in ours[c])
        n = statistics.median(x["tok_s"] for x in native[c])
        ratio = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(ours[c], native[c]) if b["tok_s"])
        mark = ""
        if c >= 4:
            mark = ">= 0.90 " + ("ok" if ratio >= 0.9 else "MISSED")
            ok &= ratio >= 0.9
        print(f"{c:>7} {o:>8.1f} {n:>8.1f} {ratio:>6.3f}  {mark}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
