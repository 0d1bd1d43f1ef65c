#!/usr/bin/env python3
"""Prompt-cache benchmark (SmolLM2): time to first token with a ~1,800-token shared system prompt.

Rows: cold; RAM hit; disk hit (same process, empty RAM tier); cold and disk hit in
NEW ``ollapy run`` processes (model load shown separately); cache on with 0% hits
(overhead); restore throughput against a plain read of the same file.
Usage: python scripts/bench_cache.py [--model PATH] [--repeat N]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"


def system_prompt(tag: str, n_rules: int = 100) -> str:
    return f"[{tag}] " + " ".join(
        f"Rule {i}: answer the user's question politely, in one short sentence, and never invent facts." for i in range(n_rules))


def ttft(m, prompt, opts, cache=True) -> float:
    t = time.perf_counter()
    req = m.submit(prompt, opts, cache=cache)
    for _ in req:
        break
    dt = time.perf_counter() - t
    req.result() if not req._closed else None
    return dt


def clear(m) -> None:
    for s in m.engine.slots:
        s.tokens = []
        m.backend.seq_clear(s.id)


def cli_run(model: Path, system: str, question: str, cache_dir: str, extra=()) -> dict:
    env = dict(os.environ, OLLAPY_CACHE_DIR=cache_dir, OLLAPY_HOST="127.0.0.1:9")
    env.pop("OLLAPY_DEBUG", None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ollapy.cli.main", "run", str(model), "--system", system, "--verbose",
                        "-o", "temperature=0", "-o", "num_predict=1", "-o", "num_ctx=4096", *extra, question],
                       capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=600)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"ollapy run failed: {p.stderr}")

    def dur(label):
        m = re.search(rf"{label}:\s+([\d.]+)(ms|s|µs)", p.stderr)
        v = float(m.group(1))
        return v / 1000 if m.group(2) == "ms" else v / 1e6 if m.group(2) == "µs" else v

    reused = int(re.search(r"prompt cache:\s+(\d+)", p.stderr).group(1))
    load = dur("load duration")
    return {"wall": wall, "load": load, "ttft": dur("total duration") - load, "reused": reused}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=8, help="cache-off/cache-on pairs for the 0%%-hit overhead")
    args = ap.parse_args()
    from ollapy.cache import PromptCache
    from ollapy.cache.fileformat import read_header, read_payload
    from ollapy.cli.runner import PathRef
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    tmp = tempfile.mkdtemp(prefix="bench-cache-")
    os.environ["OLLAPY_CACHE_DIR"] = tmp
    opts = Options(num_ctx=4096, temperature=0, num_predict=1)
    ref = PathRef(name="smollm2", path=args.model)
    m = LoadedModel(args.model, opts)
    sysp = system_prompt("shared")
    q = [f"Question {i}: what is the capital of France?" for i in range(20)]
    p = lambda s, qq: m.chat_prompt([{"role": "system", "content": s}, {"role": "user", "content": qq}])  # noqa: E731
    n_prompt = len(p(sysp, q[0]).tokens)
    med = statistics.median
    res: dict[str, float] = {}

    clear(m)
    ttft(m, p(system_prompt("warmup", 5), q[0]), opts, cache=False)
    res["cold"] = med([(clear(m), ttft(m, p(sysp, q[i]), opts, cache=False))[1] for i in range(args.repeat)])

    # 0% hits: cache on, every system prompt new (store at the save point and at the end included), against the
    # cache off, in alternating pairs with prompts of the same length: machine drift hits both sides alike
    miss_cache = PromptCache(ref, opts, root=Path(tmp) / "miss").bind(m)
    in_cache = [0.0]  # seconds the engine thread spent inside the cache (lookup + store), the direct cost

    def timed(fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                in_cache[0] += time.perf_counter() - t
        return call

    miss_cache.lookup, miss_cache.store = timed(miss_cache.lookup), timed(miss_cache.store)
    pairs = []
    for i in range(args.pairs):
        one = []
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            m.engine.cache = miss_cache if on else None
            clear(m)
            one.append((on, ttft(m, p(system_prompt(f"{'m' if on else 'c'}{i:03d}"), q[i % len(q)]), opts, cache=on)))
        off_t = next(t for on, t in one if not on)
        on_t = next(t for on, t in one if on)
        pairs.append((off_t, on_t))
    miss_cache.flush()
    m.engine.cache = None
    res["miss"] = med(t for _, t in pairs)
    res["miss_off"] = med(t for t, _ in pairs)
    res["overhead"] = med(on / off for off, on in pairs) - 1
    res["in_cache"] = in_cache[0] / args.pairs

    c = PromptCache(ref, opts, root=Path(tmp) / "hit").bind(m)
    m.engine.cache = c
    clear(m)
    ttft(m, p(sysp, q[0]), opts)
    c.flush()
    res["ram"] = med([(clear(m), ttft(m, p(sysp, q[1 + i]), opts))[1] for i in range(args.repeat)])
    disk = []
    for i in range(args.repeat):
        m.engine.cache = PromptCache(ref, opts, root=Path(tmp) / "hit").bind(m)
        clear(m)
        disk.append(ttft(m, p(sysp, q[5 + i]), opts))
    res["disk"] = med(disk)

    # restore throughput: checked read of the state file + llama_state_seq_set_data, vs a plain read
    f = max((Path(tmp) / "hit").rglob("*.kv"), key=lambda x: x.stat().st_size)
    size = f.stat().st_size
    plain, restore, check = [], [], []
    for _ in range(5):
        t = time.perf_counter()
        with open(f, "rb") as fh:
            fh.read()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        data = read_payload(read_header(f))
        t1 = time.perf_counter()
        assert m.backend.state_set(0, data)
        restore.append(time.perf_counter() - t)
        check.append(t1 - t)
    m.close()

    # new processes, as a shell script would start them
    cli_dir = str(Path(tmp) / "cli")
    cold_cli = cli_run(args.model, sysp, q[10], cli_dir, ("--no-cache",))
    cli_run(args.model, sysp, q[11], cli_dir)  # fills the cache
    hit_cli = cli_run(args.model, sysp, q[12], cli_dir)

    mb = size / 1e6
    rows = [
        ("cold (in process)", res["cold"], 1.0),
        ("cache on, 0% hits", res["miss"], res["miss_off"] / res["miss"]),
        ("RAM hit", res["ram"], res["cold"] / res["ram"]),
        ("disk hit, same process", res["disk"], res["cold"] / res["disk"]),
        ("new process, cold (--no-cache)", cold_cli["ttft"], 1.0),
        (f"new process, disk hit ({hit_cli['reused']} tok)", hit_cli["ttft"], cold_cli["ttft"] / hit_cli["ttft"]),
    ]
    print(f"\nSmolLM2-135M Q4_1, prompt {n_prompt} tokens (system ~{n_prompt - 20}), num_predict=1, "
          f"median of {args.repeat}; CPU threads {os.cpu_count()}")
    print(f"{'case':<40} {'TTFT':>10} {'speed-up vs cold':>17}")
    for name, v, r in rows:
        print(f"{name:<40} {v * 1000:>8.1f}ms {r:>16.1f}x")
    print(f"overhead at 0% hits: {res['overhead'] * 100:+.1f}% (median of {args.pairs} alternating cache-off/on pairs, "
          f"medians {res['miss_off'] * 1000:.0f} vs {res['miss'] * 1000:.0f} ms; target < 2% "
          f"{'ok' if res['overhead'] < 0.02 else 'MISSED'})")
    print(f"  direct cost: the engine thread spent {res['in_cache'] * 1000:.1f} ms per request inside the cache "
          f"(lookup + state copies for the store), {res['in_cache'] / res['miss_off'] * 100:.2f}% of the cold TTFT")
    print(f"new process model load: cold run {cold_cli['load'] * 1000:.0f} ms, hit run {hit_cli['load'] * 1000:.0f} ms; "
          f"wall {cold_cli['wall']:.2f}s vs {hit_cli['wall']:.2f}s")
    print(f"state file {mb:.1f} MB: plain read {mb / med(plain):.0f} MB/s; checked read {mb / med(check):.0f} MB/s; "
          f"checked read + restore {mb / med(restore):.0f} MB/s ({med(restore) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
