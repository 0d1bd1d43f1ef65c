#!/usr/bin/env python3
"""Step time of one ``llama_decode`` by the rows in the batch: what the draft policy's cost table learns.

Usage: ``python scripts/measure_row_cost.py MODEL.gguf [--rows 1,2,3,4,5,8,9] [--threads 2] [--repeats 15]``

Prefills 300 tokens of a log-like text, then times decode steps of ``k`` rows (each row asks for logits, as a
verification does) and removes them again (``seq_rm``); prints the median per ``k`` in ms and its ratio to the
one-row step. On a CPU the curve is not a line: with Gemma 3 270M one row goes to ``vec_dot``, more rows to tinyBLAS,
whose tiles take 4 batch rows at a time with AVX-512 (2 to 4 rows one pass over the weights, 5 a second) and 2
with AVX2 (an odd last row a pass of its own: 3 rows cost more than 4) (README, "Speculative decoding").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ollapy.engine.backend.context import Backend, ContextConfig  # noqa: E402

TEXT = "".join(f"Line {i}: the keeper logged wind speed {(i * 7) % 37 + 3} knots at the north light.\n"
               for i in range(1, 40))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,2,3,4,5,8,9")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    with Backend(args.model, ContextConfig(n_parallel=1, num_ctx=1024, num_batch=64, num_thread=args.threads)) as b:
        toks = b.tokenize(TEXT)[:300]
        n = len(toks)
        for a in range(0, n, 64):
            e = min(n, a + 64)
            b.decode(array("i", toks[a:e]), array("i", range(a, e)), array("i", [0] * (e - a)),
                     array("b", [0] * (e - a)))
        one = None
        for k in rows:
            ts = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                b.decode(array("i", toks[:k]), array("i", range(n, n + k)), array("i", [0] * k), array("b", [1] * k))
                ts.append(time.perf_counter() - t)
                b.seq_rm(0, n, -1)
            ms = statistics.median(ts) * 1000
            one = one or (ms if k == 1 else None)
            ratio = f"  {ms / one:.2f}x one row" if one else ""
            print(f"{k:3d} rows  {ms:7.1f} ms{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
