#!/usr/bin/env python3
"""Cost of cutting a sequence state into KV blocks and joining it back (ollapy.cache.kvstate), judged against
llama.cpp's own copy of the same state in the same run; every target row prints ``ok`` or ``MISSED``.

For each model and KV type (SmolLM2 and Gemma 3; f16 with flash attention off, so V is transposed, and q8_0
with it on): prefill ``--prefill`` random tokens (default 256), tile that state's KV to ``--tokens`` cells
(default 6,144; positions 0..n-1; a copy costs by its bytes, not their values, and a 6,000-token prefill takes
minutes on a shared 2-core machine), restore it into the sequence, then time the median of ``--repeat``
rounds, each running every operation once (so that load from other processes hits them alike):

* ``get``: ``llama_state_seq_get_data`` (Backend.state_get), the baseline of a save;
* ``set``: ``llama_state_seq_set_data`` (Backend.state_set), the baseline of a restore;
* ``memcpy``: one copy of the state into an already mapped buffer (for scale; a fresh buffer costs more here:
  mapping its pages as it fills took about as long as get itself);
* ``split B``: split_state(state, B) for each ``--blocks`` size; target: at most ``--split-max`` x ``get``;
* ``join_into B``: join_into of those blocks and tail into a reused buffer; target: at most ``--join-max`` x
  ``set``, and the joined bytes equal the state (else MISSED); ``join_state`` (a new buffer) beside it.

It prints the bytes per cell of the blockable part and the tail's size, and exits 1 when a row is MISSED.

Usage: python scripts/bench_kvstate.py [--tokens N] [--prefill N] [--repeat N] [--blocks 64,256]
                                       [--models smollm2,gemma3] [--split-max X] [--join-max X]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from array import array
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ollapy.cache import kvstate  # noqa: E402
from ollapy.cache.kvstate import join_into, join_state, parse_layout, split_state  # noqa: E402
from ollapy.engine.backend.context import Backend, ContextConfig  # noqa: E402

MODELS = {"smollm2": Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": Path.home() / ".cache/ollapy/test-models/gemma-3-270m-q4_k_m.gguf"}
KV = [("f16", "off"), ("q8_0", "on")]


def prefill(b: Backend, seq: int, toks: list[int]) -> None:
    for i in range(0, len(toks), b.n_batch):
        chunk = toks[i:i + b.n_batch]
        b.decode(array("i", chunk), array("i", range(i, i + len(chunk))), array("i", [seq] * len(chunk)),
                 array("b", [0] * len(chunk)))


def tiled_state(state: bytes, n_cells: int) -> bytearray:
    """``state`` (n cells, n dividing ``n_cells``) with its blockable part's KV repeated to ``n_cells`` cells."""
    s = split_state(state, parse_layout(state).n_cells)
    layout = dataclasses.replace(s.layout, n_cells=n_cells)
    rest = memoryview(s.tail)[len(s.tail) - s.layout.rest_len:]
    return join_state(s.blocks * (n_cells // s.n_cells), kvstate._encode_tail(layout, s.n_cells, [], rest))


def run_one(name: str, kv: str, fa: str, args) -> bool:
    ok = True
    with Backend(MODELS[name], ContextConfig(n_parallel=1, num_ctx=args.tokens + 64, kv_cache_type=kv,
                                             flash_attn=fa)) as b:
        toks = np.random.default_rng(0).integers(10, b.n_vocab, args.prefill).tolist()
        t0 = time.perf_counter()
        prefill(b, 0, toks)
        prefill_s = time.perf_counter() - t0
        if not b.state_set(0, tiled_state(bytes(b.state_get(0)), args.tokens)):
            print(f"{name} {kv}: llama.cpp refused the tiled state  MISSED")
            return False
        state = bytes(b.state_get(0))
        buf, fresh = bytearray(len(state)), bytearray(state)
        view = memoryview(buf)  # a bytearray slice assignment from bytes would copy the bytes first
        splits = {bt: split_state(state, bt) for bt in args.blocks}
        if any(v is None for v in splits.values()):
            print(f"{name} {kv}: split_state returned None  MISSED")
            return False
        ops = {"get": lambda: b.state_get(0), "set": lambda: b.state_set(0, fresh),
               "memcpy": lambda: view.__setitem__(slice(None), state)}
        for bt, sp in splits.items():
            ops[f"split {bt}"] = lambda bt=bt: split_state(state, bt)
            ops[f"join_into {bt}"] = lambda sp=sp: join_into(sp.blocks, sp.tail, buf)
            ops[f"join_state {bt}"] = lambda sp=sp: join_state(sp.blocks, sp.tail)
        times = {k: [] for k in ops}
        for _ in range(args.repeat):  # one round runs every operation once: noise from other processes hits all alike
            for k, fn in ops.items():
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name} {kv} flash {fa}: {args.tokens} cells, state {len(state) / 1e6:.1f} MB, prefill of {args.prefill} "
              f"{prefill_s:.0f} s; median of {args.repeat} interleaved rounds: get {med['get']:.1f} ms, "
              f"set {med['set']:.1f} ms, memcpy {med['memcpy']:.1f} ms")
        for bt, sp in splits.items():
            same = join_state(sp.blocks, sp.tail) == state
            join_into(sp.blocks, sp.tail, buf)
            same = same and buf == state
            sm, jm, js = med[f"split {bt}"], med[f"join_into {bt}"], med[f"join_state {bt}"]
            split_ok, join_ok = sm <= args.split_max * med["get"], jm <= args.join_max * med["set"] and same
            ok = ok and split_ok and join_ok
            print(f"  B={bt}: {len(sp.blocks)} blocks of {len(sp.blocks[0]) if sp.blocks else 0} B "
                  f"({sp.layout.bytes_per_cell} B/cell, {sp.layout.n_parts} part(s)), tail {len(sp.tail) / 1e6:.2f} MB")
            print(f"    split      {sm:7.1f} ms = {sm / med['get']:.2f} x get, {sm / med['memcpy']:.2f} x memcpy "
                  f"(target <= {args.split_max} x get)  {'ok' if split_ok else 'MISSED'}")
            print(f"    join_into  {jm:7.1f} ms = {jm / med['set']:.2f} x set, {jm / med['memcpy']:.2f} x memcpy "
                  f"(target <= {args.join_max} x set), bytes {'equal' if same else 'DIFFER'}  {'ok' if join_ok else 'MISSED'}")
            print(f"    join_state {js:7.1f} ms = {js / med['set']:.2f} x set, {js / med['memcpy']:.2f} x memcpy "
                  f"(a new buffer, its pages mapped as it fills)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=6144)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=9)
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
