#!/usr/bin/env python
"""Benchmark ``ollapy serve`` with N concurrent streaming clients (shared system prompt + short questions).

Starts a server (OLLAPY_NUM_PARALLEL=4) on a free loopback port with a
temporary store/cache, then for each concurrency level (default 1, 4, 16)
sends ``--requests`` chats and reports p50/p99 time to first token,
inter-token latency, aggregate generated tokens/s and the prompt-cache hit
rate (share of prompt tokens served from cache). It also reports TTFT of
the first (uncached) request vs cached ones. When ``llama-server`` is on PATH,
the same load runs against it (``-np 4``); otherwise it prints "not found".

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
    async with httpx.AsyncClient(base_url=base, timeout=600,
                                 limits=httpx.Limits(max_connections=clients + 4)) as client:
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


def start_ollapy(model: str, port: int, tmp: Path, num_ctx: int) -> subprocess.Popen:
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL="4", OLLAPY_CONTEXT_LENGTH=str(num_ctx),
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
        async with httpx.AsyncClient(base_url=base, timeout=600) as client:
            first = await fn(client, model, QUESTIONS[0], num_predict)
            again = [await fn(client, model, q, num_predict) for q in QUESTIONS[1:4]]
    finally:
        SYSTEM = saved
    unc = first["times"][0] - first["t0"] if first["times"] else float("nan")
    cac = statistics.median(r["times"][0] - r["t0"] for r in again if r["times"])
    return unc, cac


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--num-predict", type=int, default=32)
    ap.add_argument("--num-ctx", type=int, default=2048)
    ap.add_argument("--url", help="benchmark an already running ollapy serve instead of starting one")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ollapy-bench-"))
    proc = None
    try:
        if args.url:
            base = args.url.rstrip("/")
        else:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            proc = start_ollapy(args.model, port, tmp, args.num_ctx)
            wait_up(base, proc)
        httpx.post(base + "/api/generate", json={"model": args.model}, timeout=600)  # load
        unc, cac = asyncio.run(cached_vs_uncached(base, args.model, args.num_predict, "ollama"))
        rows = [asyncio.run(run_level(base, args.model, c, max(args.requests, c), args.num_predict, "ollama"))
                for c in levels]
        print(f"ollapy serve (n_parallel 4, num_ctx {args.num_ctx}, num_predict {args.num_predict}), "
              f"model {Path(args.model).name}")
        print(f"TTFT shared prefix: uncached {unc * 1000:.0f} ms, cached p50 {cac * 1000:.0f} ms (ratio {cac / unc:.2f})")
        table("ollapy serve", rows)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    exe = shutil.which("llama-server")
    if exe is None:
        print("\nllama-server: not found (put it on PATH to compare against native llama.cpp -np 4)")
        return
    port = free_port()
    lp = subprocess.Popen([exe, "-m", args.model, "--port", str(port), "--host", "127.0.0.1", "-np", "4",
                           "-c", str(args.num_ctx * 4)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        rows = [asyncio.run(run_level(base, args.model, c, max(args.requests, c), args.num_predict, "openai"))
                for c in levels]
        table("llama-server -np 4", rows)
    finally:
        lp.terminate()
        lp.wait(timeout=20)


if __name__ == "__main__":
    main()
