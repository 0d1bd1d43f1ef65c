#!/usr/bin/env python3
"""What crash isolation costs: one model in-process (``LoadedModel``) against the same model in a runner child
(``ProcessModel``, ``OLLAPY_RUNNER=process``), in one run.

Both sides are loaded once in this process (prompt cache off, the same fixed thread count, so neither side's
threads drop under load) and take turns, round by round with the order alternating each round. Each round
builds the prompt (a raw counting prompt, tokenized: one round trip to the child on the isolated side),
submits it and reads the stream as a caller does; timings are taken here, on the caller's side of the
socket, so the child's forwarding is counted:

* TTFT: from building the prompt to the first streamed chunk (ms);
* decode tokens/s: chunks after the first over the time from the first chunk to the last.

The table shows each side's median and the median of the per-round ratios (paired rounds cancel the
machine's drift). Target row: decode slowdown <= 3% (``ok``/``MISSED``); the script exits 1 when missed.
TTFT has no target (it includes one extra round trip per call, well under a millisecond).

Usage: ``python scripts/bench_runner.py [--model GGUF] [--tokens 128] [--repeats 7] [--threads N]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # SmolLM2 (greedy) keeps counting: every round decodes --tokens tokens
TARGET_SLOWDOWN = 0.03


def one_round(model, opts) -> tuple[float, float, int]:
    """(TTFT s, decode tokens/s, chunks) of one greedy generation, timed by the caller."""
    t0 = time.perf_counter()
    req = model.submit(model.raw_prompt(PROMPT), opts)
    first = last = final = None
    for chunk in req:
        now = time.perf_counter()
        if first is None:
            first = now
        last, final = now, chunk
    eval_count = final.metrics.eval_count
    return first - t0, (eval_count - 1) / max(last - first, 1e-9), eval_count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not args.model.is_file():
        print(f"model not found: {args.model} (run scripts/fetch_test_models.py)", file=sys.stderr)
        return 2

    from ollapy.options import Options
    from ollapy.runner import loader

    opts = Options(num_ctx=1024, num_parallel=1, num_thread=args.threads, temperature=0, num_predict=args.tokens)
    ref = loader.PathRef(name=args.model.stem, path=args.model)
    sides = {"in-process": loader.open_model(ref, opts, cache=False, isolated=False),
             "process": loader.open_model(ref, opts, cache=False, isolated=True)}
    runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in sides}
    try:
        for m in sides.values():  # warm-up: first-use costs (page cache, allocations) on neither side's clock
            one_round(m, opts)
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                runs[name].append(one_round(sides[name], opts))
    finally:
        for m in sides.values():
            m.close()

    inp, proc = runs["in-process"], runs["process"]
    print("per-round decode ratio process/in-process:", " ".join(f"{p[1] / i[1]:.3f}" for i, p in zip(inp, proc)))
    slowdown = statistics.median(1 - p[1] / i[1] for i, p in zip(inp, proc))
    ttft_added = statistics.median(p[0] - i[0] for i, p in zip(inp, proc))
    print(f"model {args.model.name}, {args.tokens} tokens x {args.repeats} rounds (median), {args.threads} threads")
    print(f"{'side':<12} {'decode tok/s':>13} {'TTFT ms':>9} {'tokens':>7}")
    for name, rs in runs.items():
        print(f"{name:<12} {statistics.median(x[1] for x in rs):>13.1f} "
              f"{statistics.median(x[0] for x in rs) * 1e3:>9.1f} {statistics.median(x[2] for x in rs):>7.0f}")
    ok = slowdown <= TARGET_SLOWDOWN
    print(f"{'row':<34} {'measured':>9}  target")
    print(f"{'decode slowdown (paired median)':<34} {slowdown * 100:>8.1f}%  <= {TARGET_SLOWDOWN * 100:.0f}%  "
          + ("ok" if ok else "MISSED"))
    print(f"{'TTFT added (paired median)':<34} {ttft_added * 1e3:>7.2f}ms  -")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
