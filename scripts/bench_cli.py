#!/usr/bin/env python3
"""Start-up cost of the CLI, against ``python -c pass`` measured in the same run.

Prints the median wall time of ``ollapy --help``, ``ollapy list`` and
``ollapy run MODEL "hi"``; for ``run`` it also subtracts what the engine itself
reports (load + prompt eval + eval durations from ``--verbose``) to show the
CLI's own overhead. Targets (issue 4): ``--help`` <= 0.25 s, ``list`` <= 0.35 s,
``run`` overhead <= 0.3 s.

Usage: python scripts/bench_cli.py [--model PATH] [--repeat N]
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


def timed(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, p


def parse_ns(stderr: str, label: str) -> float:
    m = re.search(rf"{label}:\s+([\d.]+)(ms|s|µs)", stderr)
    if not m:
        return 0.0
    v, unit = float(m.group(1)), m.group(2)
    return v / {"s": 1, "ms": 1e3, "µs": 1e6}[unit]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(ROOT / "scripts"))
        import fetch_test_models as f

        args.model = f.fetch_model(f.MODELS[0], f.default_dir())
    env = dict(os.environ, OLLAPY_MODELS=tempfile.mkdtemp(), OLLAPY_HOST="127.0.0.1:9", OLLAPY_CACHE="0")
    py = sys.executable
    cli = [py, "-m", "ollapy.cli.main"]
    # a pip install byte-compiles the package; an editable checkout under PYTHONDONTWRITEBYTECODE=1 would
    # instead compile every ollapy module from source on every start, a cost users never see
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "ollapy")], check=True)
    for cmd in (cli + ["--help"], cli + ["run", str(args.model), "-o", "num_predict=1", "hi"]):  # warm the page cache
        subprocess.run(cmd, capture_output=True, env=env)
    rows = {}
    for label, cmd in (("python -c pass", [py, "-c", "pass"]), ("ollapy --help", cli + ["--help"]),
                       ("ollapy list", cli + ["list"])):
        rows[label] = statistics.median(timed(cmd, env)[0] for _ in range(args.repeat))
    overheads, walls = [], []
    for _ in range(args.repeat):
        wall, p = timed(cli + ["run", str(args.model), "--verbose", "-o", "temperature=0", "-o", "num_predict=16", "hi"], env)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        engine = sum(parse_ns(p.stderr, k) for k in ("load duration", "prompt eval duration", "eval duration"))
        walls.append(wall)
        overheads.append(wall - engine)
    base = rows["python -c pass"]
    print(f"{'command':<24}{'median s':>10}{'vs python':>11}  target")
    for label, target in (("python -c pass", None), ("ollapy --help", 0.25), ("ollapy list", 0.35)):
        t = rows[label]
        mark = "" if target is None else f"<= {target}s " + ("ok" if t <= target else "MISSED")
        print(f"{label:<24}{t:>10.3f}{t / base:>10.1f}x  {mark}")
    o = statistics.median(overheads)
    print(f"{'ollapy run (wall)':<24}{statistics.median(walls):>10.3f}{statistics.median(walls) / base:>10.1f}x")
    print(f"{'run overhead':<24}{o:>10.3f}{o / base:>10.1f}x  <= 0.3s " + ("ok" if o <= 0.3 else "MISSED"))
    print("(run overhead = wall time minus the engine's load, prompt-eval and eval durations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
