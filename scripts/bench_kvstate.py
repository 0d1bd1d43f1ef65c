#!/usr/bin/env python3
"""Cost of cutting a sequence state into KV blocks and joining it back (ollapy.cache.kvstate), judged against
llama.cpp's own copy of the same state in the same run; every target row prints ``ok`` or ``MISSED``.

For each model and KV type (SmolLM2 and Gemma 3; f16 with flash attention off, so V is transposed, and q8_0
with it on): prefill ``--tokens`` random tokens (default 6,000) into a sequence, then, best of ``--repeat``:

* ``get``: ``llama_state_seq_get_data`` (Backend.state_get), the baseline of a save;
* ``set``: ``llama_state_seq_set_data`` (Backend.state_set) of that state, the baseline of a restore;
* ``split B``: split_state(state, B) for each ``--blocks`` size; target: at most ``--split-max`` x ``get``;
* ``join_into B``: join_into of those blocks and tail into a reused buffer; target: at most ``--join-max`` x
  ``set``; and the joined bytes equal the state (else MISSED). ``join_state`` (a new buffer) and a plain
  memcpy of the state are printed beside it.

It prints the bytes per cell of the blockable part, the tail's size, and exits 1 when any row is MISSED.
Timings on a shared machine are noisy: the header prints the load average.

Usage: python scripts/bench_kvstate.py [--tokens N] [--repeat N] [--blocks 64,256] [--models smollm2,gemma3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ollapy.cache.kvstate import join_into, join_state, split_state  # noqa: E402
from ollapy.engine.backend.context import Backend, ContextConfig  # noqa: E402

MODELS = {"smollm2": Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": Path.home() / ".cache/ollapy/test-models/gemma-3-270m-q4_k_m.gguf"}
KV = [("f16", "off"), ("q8_0", "on")]


def best_ms(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def prefill(b: Backend, seq: int, toks: list[int]) -> None:
    for i in range(0, len(toks), b.n_batch):
        chunk = toks[i:i + b.n_batch]
        b.decode(array("i", chunk), array("i", range(i, i + len(chunk))), array("i", [seq] * len(chunk)),
                 array("b", [0] * len(chunk)))


def run_one(name: str, kv: str, fa: str, args) -> bool:
    ok = True
    with Backend(MODELS[name], ContextConfig(n_parallel=1, num_ctx=args.tokens + 64, kv_cache_type=kv,
                                             flash_attn=fa)) as b:
        toks = np.random.default_rng(0).integers(10, b.n_vocab, args.tokens).tolist()
        t0 = time.perf_counter()
        prefill(b, 0, toks)
        prefill_s = time.perf_counter() - t0
        get_ms, state = best_ms(lambda: b.state_get(0), args.repeat)
        state = bytes(state)
        set_ms, _ = best_ms(lambda: b.state_set(0, bytearray(state)), args.repeat)  # a writable copy: no extra copy inside
        print(f"{name} {kv} flash {fa}: {args.tokens} tokens, state {len(state) / 1e6:.1f} MB, prefill {prefill_s:.0f} s, "
              f"get {get_ms:.1f} ms, set {set_ms:.1f} ms")
        buf = bytearray(len(state))
        copy_ms, _ = best_ms(lambda: buf.__setitem__(slice(None), state), args.repeat)
        print(f"  memcpy of the state into a mapped buffer: {copy_ms:.1f} ms")
        for bt in args.blocks:
            split_ms, s = best_ms(lambda bt=bt: split_state(state, bt), args.repeat)
            if s is None:
                print(f"  B={bt}: split_state returned None  MISSED")
                ok = False
                continue
            join_ms, joined = best_ms(lambda s=s: join_state(s.blocks, s.tail), args.repeat)
            into_ms, _ = best_ms(lambda s=s: join_into(s.blocks, s.tail, buf), args.repeat)
            same = joined == state and buf == state
            split_ok = split_ms <= args.split_max * get_ms
            join_ok = into_ms <= args.join_max * set_ms and same
            ok = ok and split_ok and join_ok
            print(f"  B={bt}: {len(s.blocks)} blocks of {len(s.blocks[0]) if s.blocks else 0} B "
                  f"({s.layout.bytes_per_cell} B/cell, {s.layout.n_parts} part(s)), tail {len(s.tail) / 1e6:.2f} MB")
            print(f"    split      {split_ms:7.1f} ms = {split_ms / get_ms:.2f} x get, {split_ms / copy_ms:.2f} x memcpy "
                  f"(target <= {args.split_max} x get)  {'ok' if split_ok else 'MISSED'}")
            print(f"    join_into  {into_ms:7.1f} ms = {into_ms / set_ms:.2f} x set, {into_ms / copy_ms:.2f} x memcpy "
                  f"(target <= {args.join_max} x set), bytes {'equal' if same else 'DIFFER'}  "
                  f"{'ok' if join_ok else 'MISSED'}")
            print(f"    join_state {join_ms:7.1f} ms = {join_ms / set_ms:.2f} x set, {join_ms / copy_ms:.2f} x memcpy "
                  f"(a new buffer: its pages are mapped as it fills)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=6000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", type=lambda v: [int(x) for x in v.split(",")], default=[64, 256])
    ap.add_argument("--models", type=lambda v: v.split(","), default=list(MODELS))
    ap.add_argument("--split-max", type=float, default=1.0)
    ap.add_argument("--join-max", type=float, default=1.0)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    ok = True
    for name in args.models:
        for kv, fa in KV:
            ok = run_one(name, kv, fa, args) and ok
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
