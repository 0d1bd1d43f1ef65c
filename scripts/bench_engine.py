#!/usr/bin/env python3
"""Benchmark ollapy's engine against a bare llama.cpp loop measured in the same run (best of interleaved runs).

Prints, for one model (default: SmolLM2 test model) with fixed threads:
prefill tokens/s, single-stream decode tokens/s, and aggregate decode
tokens/s at 1, 2, 4 and 8 slots, for ollapy and for the baseline, and the
ratios. The baseline is llama.cpp's ``llama-batched-bench`` (same llama.cpp
version, built from the llama-cpp-python sdist) when it is on PATH or given
with ``--native``; otherwise a bare loop over the same low-level API (same
context settings, same CPU buffer-type choice) that decodes the same number
of sequences in one batch per step, with none of ollapy's scheduling,
sampling or detokenizing. When both are available both are printed.

Machine noise on a shared VM moves a figure between processes (docs/benchmarks.md), so every figure of
every side runs in its own fresh process (no OpenMP thread team left over
from an earlier model), the sides are interleaved figure by figure over
``--repeat`` rounds (order alternating each round), and the table shows the
best run of each side plus the median of the per-round ratios; the targets
are judged on that median (paired runs cancel the machine's drift; a
best-of ratio moves with one lucky run on either side).

Targets (issue 2): single-stream decode >= 0.95x baseline; aggregate decode
at 2, 4, 8 slots >= 0.9x baseline at the same number of sequences. ``--target R`` judges every decode figure
against R instead (issue 55: 0.98 on Qwen2.5-Coder-1.5B, a compute-bound model, against llama-batched-bench).
``--no-bare`` leaves out the bare loop (a reference only when the native baseline runs) and ``--prefill 0`` the
prefill figure (no target), for models too slow to measure everything on a small machine.

Usage: python scripts/bench_engine.py [--model PATH] [--threads N] [--tokens N] [--repeat R] [--native PATH]
                                      [--target R] [--no-bare] [--prefill N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ollapy.options import Options  # noqa: E402

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
NUM_CTX = 512  # KV cells per sequence in the decode figures, on every side
# 8 prompts SmolLM2 (greedy) keeps counting on for 100+ tokens: a sequence that stops early at EOS would leave
# ollapy fewer sequences per step than the baselines, which always decode all of them
PROMPTS = [PROMPT + " " * i for i in (0, 1, 2, 4, 5, 6, 7)] + ["6, 7, 8, 9, 10, 11, 12, 13, 14, 15,"]


def default_model() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fetch_test_models as f

    m = f.MODELS[0]
    return f.fetch_model(m, f.default_dir())


def bench_ollapy(path: Path, threads: int, n_tokens: int, slots: list[int], prefill_len: int) -> dict:
    from ollapy.engine.model import LoadedModel

    out = {}
    if prefill_len:  # one long raw prompt, cache off, measured by the engine's prompt_eval_duration
        m = LoadedModel(path, Options(num_ctx=2048, num_parallel=1, num_thread=threads, num_batch=512))
        try:
            toks = m.tokenize(" ".join(str(i) for i in range(4000)))[:prefill_len]
            best = 0.0
            for _ in range(3):
                m.engine.slots[0].tokens = []  # the slot is idle: forget its KV, so the whole prompt is prefilled
                m.backend.seq_clear(0)
                req = m.engine.submit(toks, Options(temperature=0, num_predict=1, num_ctx=2048), cache=False)
                _, final = req.result()
                best = max(best, len(toks) / (final.metrics.prompt_eval_duration / 1e9))
            out["prefill"] = best
        finally:
            m.close()
    for n in slots:
        m = LoadedModel(path, Options(num_ctx=NUM_CTX, num_parallel=n, num_thread=threads, num_batch=512))
        try:
            opts = Options(temperature=0, num_predict=n_tokens, num_ctx=NUM_CTX)
            # warm-up
            m.submit(m.raw_prompt(PROMPT), opts.merged({"num_predict": 4}), cache=False).result()
            reqs = [m.submit(m.raw_prompt(PROMPTS[i % len(PROMPTS)]), opts, cache=False) for i in range(n)]
            finals = [r.result()[1] for r in reqs]
            short = [f.metrics.eval_count for f in finals if f.metrics.eval_count < n_tokens]
            if short:
                print(f"warning: {len(short)} of {n} sequences stopped early ({short} tokens)", file=sys.stderr)
            total = sum(f.metrics.eval_count for f in finals)
            dur = max(f.metrics.eval_duration for f in finals) / 1e9
            # each request's first token comes from prefill: count decode steps only
            out[n] = (total - n) / dur if dur else 0.0
        finally:
            m.close()
    return out


def bench_bare(path: Path, threads: int, n_tokens: int, slots: list[int], prefill_len: int) -> dict:
    """A bare ctypes loop: same context settings, one llama_decode per step, no sampling (feeds a fixed token)."""
    from llama_cpp import llama_cpp as C

    from ollapy.engine.backend.bindings import choose_extra_bufts
    from ollapy.engine.hardware import choose_flash_attn

    C.llama_backend_init()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = choose_extra_bufts("auto")[0]
    mp.n_gpu_layers = 999 if C.llama_supports_gpu_offload() else 0
    model = C.llama_model_load_from_file(str(path).encode(), mp)
    vocab = C.llama_model_get_vocab(model)
    out = {}

    def make_ctx(n_seq: int, n_ctx: int):
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx * n_seq
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = False
        cp.swa_full = True
        cp.no_perf = True
        fa = choose_flash_attn("auto", "f16", mp.n_gpu_layers > 0)  # the same choice ollapy makes
        cp.flash_attn_type = {"auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED}[fa]
        return C.llama_init_from_model(model, cp)

    def tokenize(text: str) -> list[int]:
        data = text.encode()
        buf = (C.llama_token * (len(data) + 8))()
        n = C.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
        return list(buf[:n])

    batch = C.llama_batch_init(512, 0, 1)

    def decode(ctx, entries):
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, logit) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logit
        assert C.llama_decode(ctx, batch) == 0

    if prefill_len:
        ctx = make_ctx(1, 2048)
        toks = tokenize(" ".join(str(i) for i in range(4000)))[:prefill_len]
        best = 0.0
        for _ in range(3):
            C.llama_memory_clear(C.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            decode(ctx, [(t, i, 0, int(i == len(toks) - 1)) for i, t in enumerate(toks)])
            C.llama_get_logits_ith(ctx, -1)
            best = max(best, len(toks) / (time.perf_counter() - t0))
        out["prefill"] = best
        C.llama_free(ctx)
    prompt = tokenize(PROMPT)
    for n in slots:
        ctx = make_ctx(n, NUM_CTX)
        for s in range(n):
            decode(ctx, [(t, i, s, int(i == len(prompt) - 1)) for i, t in enumerate(prompt)])
        pos = len(prompt)
        tok = prompt[-1]
        decode(ctx, [(tok, pos, s, 1) for s in range(n)])  # warm-up step
        pos += 1
        t0 = time.perf_counter()
        for _ in range(n_tokens - 1):
            decode(ctx, [(tok, pos, s, 1) for s in range(n)])
            for s in range(n):
                C.llama_get_logits_ith(ctx, s)
            pos += 1
        dt = time.perf_counter() - t0
        out[n] = n * (n_tokens - 1) / dt
        C.llama_free(ctx)
    C.llama_batch_free(batch)
    C.llama_model_free(model)
    return out


def bench_native(exe: str, path: Path, threads: int, n_tokens: int, slots: list[int], prefill_len: int) -> dict:
    """llama.cpp's ``llama-batched-bench``: prefill from one ``prefill_len`` prompt, decode with 16-token prompts.

    Same settings as the other sides: ``-c`` large enough for every sequence,
    n_batch/n_ubatch 512, flash attention off on the CPU, weight repacking
    (extra buffer types) as ollapy chooses it for this CPU.
    """
    from ollapy.engine.backend.bindings import choose_extra_bufts

    common = ["-m", str(path), "-t", str(threads), "-b", "512", "-ub", "512", "-fa", "off", "--output-format", "jsonl"]
    if not choose_extra_bufts("auto")[0]:
        common.append("--no-repack")

    def run(args: list[str]) -> list[dict]:
        p = subprocess.run([exe, *common, *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{exe} failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
        rows = []
        for line in (p.stdout + "\n" + p.stderr).splitlines():
            line = line.strip()
            if line.startswith("{") and '"speed_tg"' in line:
                rows.append(json.loads(line))
        return rows

    out = {}
    if prefill_len:
        pre = run(["-c", "2048", "-npp", str(prefill_len), "-ntg", "1", "-npl", "1"])
        out["prefill"] = max(r["speed_pp"] for r in pre)
    if slots:
        ctx = max(slots) * NUM_CTX  # the same KV cells per sequence as the other sides (attention work depends on it)
        for r in run(["-c", str(ctx), "-npp", "16", "-ntg", str(n_tokens), "-npl", ",".join(map(str, slots))]):
            out[int(r["pl"])] = r["speed_tg"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96, help="tokens generated per sequence")
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens for the prefill figure")
    ap.add_argument("--repeat", type=int, default=5, help="rounds; each side runs once per round")
    ap.add_argument("--slots", default="1,2,4,8", help="slot counts to measure (comma-separated)")
    ap.add_argument("--native", help="llama-batched-bench executable (default: from PATH)")
    ap.add_argument("--target", type=float, default=None,
                    help="judge every decode figure against this ratio (default: 0.95 at 1 slot, 0.9 above)")
    ap.add_argument("--no-bare", action="store_true", help="leave out the bare low-level loop (reference only)")
    ap.add_argument("--side", choices=["bare", "ollapy", "native"], help=argparse.SUPPRESS)
    ap.add_argument("--figure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = args.model or default_model()
    slots = [int(x) for x in args.slots.split(",")]
    import shutil

    native = args.native or shutil.which("llama-batched-bench")
    if args.side:  # one figure of one side in its own process: no OpenMP thread teams left over from another
        figure_slots = [] if args.figure == "prefill" else [int(args.figure)]
        prefill = args.prefill if args.figure == "prefill" else 0
        if args.side == "native":
            res = bench_native(native, path, args.threads, args.tokens, figure_slots, prefill)
        else:
            fn = bench_bare if args.side == "bare" else bench_ollapy
            res = fn(path, args.threads, args.tokens, figure_slots, prefill)
        print(json.dumps(res))
        return 0
    sides = ["ollapy"] + ([] if args.no_bare and native else ["bare"]) + (["native"] if native else [])
    figures = (["prefill"] if args.prefill else []) + list(map(str, slots))
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {k: [] for k in sides}

    def side(name: str, figure: str) -> dict:
        cmd = [sys.executable, __file__, "--side", name, "--figure", figure, "--model", str(path),
               "--threads", str(args.threads), "--tokens", str(args.tokens), "--prefill", str(args.prefill)]
        if native:
            cmd += ["--native", native]
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        for line in p.stderr.splitlines():
            if line.startswith("warning:"):
                print(f"{name}, {figure}: {line}", file=sys.stderr)
        out = p.stdout.strip().splitlines()[-1]
        return {("prefill" if k == "prefill" else int(k)): v for k, v in json.loads(out).items()}

    for i in range(args.repeat):  # interleave, alternating the order, to spread machine noise over all sides
        got: dict[str, dict] = {k: {} for k in sides}
        for figure in figures:
            for name in (sides if i % 2 == 0 else sides[::-1]):
                got[name].update(side(name, figure))
        for name in sides:
            runs[name].append(got[name])
    best = lambda name, k: max(r[k] for r in runs[name])  # noqa: E731 - least machine noise
    load_after = os.getloadavg()
    print(f"model: {path.name}  threads: {args.threads}  tokens/seq: {args.tokens}  rounds: {args.repeat}")
    print(f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after on "
          f"{os.cpu_count()} CPUs" + (" -- other processes competed: timings are noisy"
                                                   if max(load_before[0], load_after[0]) > args.threads else ""))
    if native:
        print(f"native: {native}")
    rows = [("prefill tok/s", "prefill", None)] * bool(args.prefill)
    rows += [("decode tok/s, 1 slot", 1, args.target or 0.95)] * (1 in slots)
    rows += [(f"aggregate decode, {n} slots", n, args.target or 0.9) for n in slots if n > 1]
    ok = True
    for base in sides[1:]:
        judged = base == sides[-1]  # the baseline: native when present, else the bare loop
        title = "llama-batched-bench" if base == "native" else "bare low-level loop"
        print(f"\nvs {title}{'' if judged else ' (for reference)'}")
        print(f"{'figure':<28}{'ollapy':>10}{'baseline':>10}{'ratio':>7}{'median':>8}  target")
        for label, key, target in rows:
            o, b = best("ollapy", key), best(base, key)
            ratio = o / b if b else 0.0
            med = statistics.median(ro[key] / rb[key] for ro, rb in zip(runs["ollapy"], runs[base]) if rb[key])
            mark = ""
            if target is not None and judged:
                mark = f">= {target}  " + ("ok" if med >= target else "MISSED")
                ok &= med >= target
            print(f"{label:<28}{o:>10.1f}{b:>10.1f}{ratio:>7.2f}{med:>8.2f}  {mark}")
    print("\n(ratio: best run of ollapy / best run of the baseline; median: median of the per-round ratios, each from"
          "\n two runs made back to back; targets are judged on the median, which one lucky run cannot move)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
