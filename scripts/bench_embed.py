"""Embedding throughput: ollapy (in-process, ``LoadedModel.embed``) against llama.cpp's own ``llama-embedding``.

Both sides embed the same 1, 16 and 256 inputs of about 30 tokens with the same
model, threads, pooling (LAST: what ollapy uses for a decoder without a GGUF
``pooling_type``), flash-attention setting and batch size (``n_ctx = n_batch =
n_ubatch`` = ``--batch``: one decode holds as many whole inputs as fit, the
packing rule of both), and report inputs/s and tokens/s.

Method. ollapy: the model is loaded once and warmed up (one embed, which also
creates the embedding context); each row is the best of ``--repeats`` timed
``embed()`` calls (tokenizing, decoding, pooling, normalising: everything a
request does after the model is loaded). Native: ``llama-embedding`` runs once
per row on a file of the inputs (``-f``, one per line); its log lines carry
timestamps from its own start, so its model load (everything up to the first
``batch_decode`` line: load, warm-up, tokenizing) is taken from its own output
and subtracted from the process's wall time; the rest (decoding, pooling,
normalising, printing the vectors, freeing) is its embedding time, also the best
of ``--repeats``. Its load time is reported beside it.

Targets: at 256 inputs ollapy's inputs/s must be at least 0.9 of native's, and
every ollapy vector must be within 1e-3 cosine distance of native's (parsed from
``--embd-output-format array``). Each target row prints ``ok`` or ``MISSED``;
the script exits 1 when one is missed, 2 when ``llama-embedding`` is missing.

``llama-embedding`` is found on PATH or at ~/.cache/ollapy/native/build/bin
(built from the same llama.cpp version by ``bash scripts/build_native_baselines.sh``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"
NATIVE_DEFAULT = Path.home() / ".cache/ollapy/native/build/bin/llama-embedding"
SUBJECTS = ["river", "library", "engine", "garden", "market", "orchestra", "harbour", "laboratory"]
SIZES = (1, 16, 256)
TARGET_RATIO = 0.9
MAX_COS_DISTANCE = 1e-3


def sentences(n: int) -> list[str]:
    """``n`` distinct sentences of about 30 tokens each."""
    return [f"Report {i}: on a quiet morning the {SUBJECTS[i % 8]} near the old town was busier than usual, "
            f"and {i % 7 + 2} visitors wrote careful notes about what they saw there." for i in range(n)]


def find_native() -> Path | None:
    """``llama-embedding`` on PATH, else at the native-build default location, else None."""
    found = shutil.which("llama-embedding")
    if found:
        return Path(found)
    return NATIVE_DEFAULT if NATIVE_DEFAULT.is_file() else None


def run_native(exe: Path, model: Path, texts: list[str], threads: int, batch: int, flash: str) -> tuple[float, float, list]:
    """One ``llama-embedding`` run: ``(embedding seconds, load seconds, vectors)``."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts))
        path = f.name
    try:
        cmd = [str(exe), "-m", str(model), "-f", path, "-t", str(threads), "-c", str(batch), "-b", str(batch),
               "-ub", str(batch), "--pooling", "last", "-fa", flash, "--embd-output-format", "array", "--log-timestamps"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise SystemExit(f"llama-embedding failed ({p.returncode}): {p.stderr[-2000:]}")
    m = re.search(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I batch_decode", p.stderr, re.M)
    if not m:
        raise SystemExit("could not find llama-embedding's first batch_decode log line (timestamps)")
    h, mi, ms, us = (int(g) for g in m.groups())
    load = h * 60 + mi + ms / 1e3 + us / 1e6  # log timestamp: minutes.seconds.milliseconds.microseconds
    start = p.stdout.index("[[")
    vectors = json.loads(p.stdout[start:p.stdout.rindex("]]") + 2])
    return wall - load, load, vectors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--threads", type=int, default=0, help="0: ollapy's default for this machine")
    ap.add_argument("--batch", type=int, default=512, help="n_ctx = n_batch = n_ubatch of both sides")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    exe = find_native()
    if exe is None:
        print("llama-embedding not found on PATH nor at " + str(NATIVE_DEFAULT) + ".\n"
              "Build it from the installed llama-cpp-python's llama.cpp: bash scripts/build_native_baselines.sh "
              "(then export PATH=\"$HOME/.cache/ollapy/native/build/bin:$PATH\")", file=sys.stderr)
        return 2

    import numpy as np

    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    texts = sentences(max(SIZES))
    opts = Options(num_ctx=args.batch, num_batch=args.batch, num_thread=args.threads)
    rows, ours_vectors = [], None
    with LoadedModel(args.model, opts) as m:
        threads, flash = m.backend.threads, m.backend.flash_attn
        name = m.backend.meta("general.name") or m.path.name
        m.embed(["warm up"])
        for n in SIZES:
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                r = m.embed(texts[:n])
                best = min(best, time.perf_counter() - t0)
            rows.append([n, r.prompt_tokens, best])
            ours_vectors = r.vectors
    print(f"model: {name} ({args.model.name}), threads: {threads}, batch: {args.batch}, pooling: last, "
          f"flash_attn: {flash}, native: {exe}")
    native_vectors = None
    for row in rows:
        best, load = float("inf"), 0.0
        for _ in range(args.repeats):
            secs, load, vecs = run_native(exe, args.model, texts[:row[0]], threads, args.batch, flash)
            best = min(best, secs)
        row += [best, load]
        native_vectors = vecs
    print(f"{'inputs':>6} {'tokens':>6} | {'ollapy in/s':>11} {'tok/s':>8} | {'native in/s':>11} {'tok/s':>8} "
          f"{'(load s)':>8} | {'ratio':>5}")
    missed = False
    for n, toks, ours, native, load in rows:
        ratio = native / ours
        verdict = ""
        if n == max(SIZES):
            verdict = "ok" if ratio >= TARGET_RATIO else "MISSED"
            missed |= verdict == "MISSED"
        print(f"{n:>6} {toks:>6} | {n / ours:>11.2f} {toks / ours:>8.1f} | {n / native:>11.2f} {toks / native:>8.1f} "
              f"{load:>8.2f} | {ratio:>5.2f} {verdict} {f'(target >= {TARGET_RATIO} of native)' if verdict else ''}")
    a = np.asarray(ours_vectors, dtype=np.float64)
    b = np.asarray(native_vectors, dtype=np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    dist = float((1 - cos).max()) if a.shape == b.shape else float("inf")
    verdict = "ok" if dist <= MAX_COS_DISTANCE else "MISSED"
    missed |= verdict == "MISSED"
    print(f"vectors vs native ({a.shape[0]} inputs): max cosine distance {dist:.2e} {verdict} "
          f"(target <= {MAX_COS_DISTANCE:g})")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
