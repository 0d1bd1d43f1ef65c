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


def plain_httpx(url: str, out: Path) -> float:
    """Seconds for a plain streaming GET of ``url`` written to ``out``."""
    import httpx

    t = time.perf_counter()
    with httpx.Client() as c, c.stream("GET", url) as r, open(out, "wb", buffering=0) as f:
        for block in r.iter_bytes(1 << 20):
            f.write(block)
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
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from fake_registry import FakeRegistry
    from fetch_test_models import MODELS, default_dir

    model = next(m for m in MODELS if m.name == "gemma3")
    path = default_dir() / model.filename
    if not path.is_file():
        print(f"error: {path} missing; run scripts/fetch_test_models.py", file=sys.stderr)
        return 1
    os.environ["OLLAMA_MODELS"] = "/nonexistent"
    with FakeRegistry() as reg, tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        reg.add_blob(path, model.sha256)
        reg.manifests[("library", "bench", "big")] = {
            "schemaVersion": 2, "layers": [{"mediaType": "application/vnd.ollama.image.model",
                                            "digest": f"sha256:{model.sha256}", "size": model.size}]}
        os.environ["OLLAPY_REGISTRY"] = reg.url
        url = f"{reg.url}/v2/library/bench/blobs/sha256:{model.sha256}"
        plain_httpx(url, Path(tmp) / "warm")  # warm the server's cache and the page cache
        mb = model.size / 1e6
        res: dict[str, list[float]] = {"httpx": [], "curl": [], "pull": [], "verify": []}
        for i in range(args.rounds):
            res["httpx"].append(plain_httpx(url, Path(tmp) / "plain"))
            c = plain_curl(url, Path(tmp) / "curl")
            if c is not None:
                res["curl"].append(c)
            store = Path(tmp) / f"store{i}"
            total, verify = timed_pull("bench:big", store)
            res["pull"].append(total)
            res["verify"].append(verify)
            shutil.rmtree(store)
        best = {k: min(v) for k, v in res.items() if v}
        print(f"blob: {model.filename} {mb:.0f} MB from {reg.url} (loopback), {args.rounds} rounds, best of each")
        for k in ("httpx", "curl", "pull"):
            if k in best:
                print(f"  {k:<6} {mb / best[k]:8.0f} MB/s  ({best[k]:.2f} s)")
        print(f"  pull/httpx ratio: {best['httpx'] / best['pull']:.2f} (target >= 0.9)")
        if "curl" in best:
            print(f"  pull/curl ratio:  {best['curl'] / best['pull']:.2f}")
        print(f"  verify (last byte -> blob renamed): {best['verify'] * 1000:.1f} ms; sha256 computed while streaming")
    return 0


if __name__ == "__main__":
    sys.exit(main())
