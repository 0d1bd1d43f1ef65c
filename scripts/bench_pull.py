#!/usr/bin/env python3
"""Benchmark ``pull`` against a plain download of the same URL, in the same run.

Serves the Gemma-3-270M test GGUF (253 MB; from scripts/fetch_test_models.py)
from the loopback fake Ollama registry in ``tests/fake_registry.py``, then for
``--rounds`` rounds alternately: (a) a plain httpx streaming GET written to a
file (and ``curl -o`` when curl is installed), (b) ``ollapy.store.pull_model``
into an empty temporary store (sha256 computed while streaming, size +
digest checked, rename). Reports MB/s (decimal MB), the pull/plain ratio
(target >= 0.9) and the time from the last byte to the finished blob (the
"verify" time: no second read pass). Usage: ``python scripts/bench_pull.py [--rounds N]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]


def cpu_s() -> float:
    """User + system CPU seconds used by this process so far (all threads)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def plain_httpx(url: str, out: Path) -> float:
    """Seconds for a plain streaming GET of ``url`` written to ``out``."""
    import httpx

    t = time.perf_counter()
    with httpx.Client() as c, c.stream("GET", url) as r, open(out, "wb", buffering=0) as f:
        f.writelines(r.iter_bytes())
    return time.perf_counter() - t


def plain_curl(url: str, out: Path) -> float | None:
    """Seconds for ``curl -s -o out url``, or None without curl."""
    if not shutil.which("curl"):
        return None
    t = time.perf_counter()
    subprocess.run(["curl", "-s", "-o", str(out), url], check=True)
    return time.perf_counter() - t


def timed_pull(name: str, store: Path) -> tuple[float, float]:
    """(total seconds, seconds from the last byte to the renamed blob) for one pull into ``store``."""
    from ollapy.store import download, pull_model

    marks: dict[str, float] = {}
    real_finish = download._finish

    def finish(*a, **k):
        marks["last_byte"] = time.perf_counter()
        out = real_finish(*a, **k)
        marks["renamed"] = time.perf_counter()
        return out

    download._finish = finish
    os.environ["OLLAPY_MODELS"] = str(store)
    try:
        t = time.perf_counter()
        pull_model(name, quiet=True)
        total = time.perf_counter() - t
    finally:
        download._finish = real_finish
    return total, marks["renamed"] - marks["last_byte"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a small table; exit 1 when the test model is missing."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from fetch_test_models import MODELS, default_dir

    model = next(m for m in MODELS if m.name == "gemma3")
    path = default_dir() / model.filename
    if not path.is_file():
        print(f"error: {path} missing; run scripts/fetch_test_models.py", file=sys.stderr)
        return 1
    os.environ["OLLAMA_MODELS"] = "/nonexistent"
    # The server runs in its own process, as a real registry would: it must not share our GIL.
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_registry.py"), str(path), "library/bench:big"],
                              stdout=subprocess.PIPE, text=True)
    try:
        base, digest = server.stdout.readline().split()
        return _run(args, model, base, digest)
    finally:
        server.terminate()
        server.wait()


def _run(args, model, base: str, digest: str) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        os.environ["OLLAPY_REGISTRY"] = base
        url = f"{base}/v2/library/bench/blobs/{digest}"
        plain_httpx(url, Path(tmp) / "warm")  # warm the server's cache and the page cache
        mb = model.size / 1e6
        res: dict[str, list[float]] = {"httpx": [], "curl": [], "pull": [], "verify": [], "cpu_httpx": [], "cpu_pull": []}
        for i in range(args.rounds):
            c0 = cpu_s()
            res["httpx"].append(plain_httpx(url, Path(tmp) / "plain"))
            res["cpu_httpx"].append(cpu_s() - c0)
            c = plain_curl(url, Path(tmp) / "curl")
            if c is not None:
                res["curl"].append(c)
            store = Path(tmp) / f"store{i}"
            c0 = cpu_s()
            total, verify = timed_pull("bench:big", store)
            res["cpu_pull"].append(cpu_s() - c0)
            res["pull"].append(total)
            res["verify"].append(verify)
            shutil.rmtree(store)
        import statistics

        best = {k: min(v) for k, v in res.items() if v}
        med = {k: statistics.median(v) for k, v in res.items() if v}
        print(f"blob: {model.filename} {mb:.0f} MB from {base} (loopback, server in its own process), "
              f"{args.rounds} rounds")
        for k in ("httpx", "curl", "pull"):
            if k in best:
                print(f"  {k:<6} best {mb / best[k]:6.0f} MB/s ({best[k]:.2f} s)   median {mb / med[k]:6.0f} MB/s")
        print(f"  pull/httpx ratio: best {best['httpx'] / best['pull']:.2f}, "
              f"median {med['httpx'] / med['pull']:.2f} (target >= 0.9)")
        if "curl" in best:
            print(f"  pull/curl ratio:  {best['curl'] / best['pull']:.2f}")
        print(f"  CPU seconds (median): httpx {med['cpu_httpx']:.2f}, pull {med['cpu_pull']:.2f} "
              f"(pull also hashes and sets up a client; its wall ratio needs a spare core)")
        print(f"  load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print(f"  verify (last byte -> blob renamed): {best['verify'] * 1000:.1f} ms; sha256 computed while streaming")
    return 0


if __name__ == "__main__":
    sys.exit(main())
