#!/usr/bin/env python3
"""Vision benchmark (SmolLM2-135M + the synthetic projector of scripts/make_test_vlm.py): it judges itself.

Each row prints ``ok`` or ``MISSED`` against a baseline measured in the same run:

* image encode: the projector's time for one image (``image_encode_duration``, median of the cold requests).
  Informational, with no target.
* TTFT, cold: a chat with an image never seen before (same size, new pixels). This is the baseline.
* TTFT, cached: the second request for a picture already answered once, sent again with equal pixels in
  another encoding (BMP instead of PNG). The prompt cache (RAM tier, opened as ``ollapy serve`` opens it)
  serves the prefix through the image, so the image is not encoded again. Target: at least ``--target``
  times faster than cold (default 3x).
* cached == cold: the greedy answers of the cached requests equal those of ``cache=False`` runs of the same
  pictures.

TTFT here is the wall time from submitting the request to its first streamed chunk, in process. Cold and
cached requests alternate, and medians are over ``--repeat`` pairs. The header prints the load average:
timings from a busy machine are noisy. Exits 1 when a target row is MISSED.

Usage: python scripts/bench_vision.py [--model PATH] [--repeat N] [--target X] [--threads N]
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _projector(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_test_vlm", ROOT / "scripts" / "make_test_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_projector(out, "gemma3", 0, 576)


def picture(seed: int, fmt: str = "PNG") -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def timed(model, opts, image: bytes, cache: bool = True) -> tuple[float, str, object]:
    """(seconds to the first chunk, the answer, the final chunk's metrics)."""
    t0 = time.perf_counter()
    req = model.chat([{"role": "user", "content": "Describe the picture in detail.", "images": [image]}], opts,
                     cache=cache)
    first, parts, last = None, [], None
    for chunk in req:
        if first is None:
            first = time.perf_counter() - t0
        parts.append(chunk.text)
        last = chunk
    return first or 0.0, "".join(parts), last.metrics


def main(argv: list[str] | None = None) -> int:
    from tests.conftest import _model_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="text model GGUF (default: the SmolLM2 test model)")
    ap.add_argument("--repeat", type=int, default=5, help="cold/cached pairs (default 5)")
    ap.add_argument("--target", type=float, default=3.0, help="cached TTFT speed-up target (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="num_thread (default: llama.cpp's choice)")
    args = ap.parse_args(argv)

    from ollapy.options import Options
    from ollapy.runner.loader import PathRef, open_model

    model_path = args.model or _model_path("smollm2")
    print(f"# bench_vision  model={model_path.name}  load average before: {os.getloadavg()[0]:.2f}")
    missed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OLLAPY_CACHE_DIR"] = str(Path(tmp) / "cache")
        proj = _projector(Path(tmp) / "mmproj-test.gguf")
        o = {"num_ctx": 1024, "num_parallel": 1, "temperature": 0, "num_predict": 4}
        if args.threads:
            o["num_thread"] = args.threads
        opts = Options().merged(o)
        ref = PathRef(name="smol-vision", path=model_path, projector=proj)
        model = open_model(ref, opts, cache=True, write_back=False, isolated=False)
        try:
            timed(model, opts, picture(10_000))  # warm-up: first-use costs (allocations, page cache)
            cold, cached, encode, exact = [], [], [], True
            for i in range(args.repeat):
                t_cold, text_cold, m = timed(model, opts, picture(i))
                cold.append(t_cold)
                encode.append(m.image_encode_duration / 1e9)
                timed(model, opts, picture(1000 + i))  # another picture in the slot: the hit must come from the cache
                t_hit, text_hit, m_hit = timed(model, opts, picture(i, "BMP"))
                cached.append(t_hit)
                _, text_off, _ = timed(model, opts, picture(i), cache=False)
                exact &= text_hit == text_cold == text_off and m_hit.image_encode_duration == 0
        finally:
            model.close()
    c, h, e = statistics.median(cold), statistics.median(cached), statistics.median(encode)
    ratio = c / h if h else float("inf")
    ok = ratio >= args.target
    print(f"{'row':<34}{'value':>14}  result")
    print(f"{'image encode (median)':<34}{e * 1000:>11.1f} ms  (no target)")
    print(f"{'TTFT cold, new image (median)':<34}{c * 1000:>11.1f} ms  (baseline)")
    print(f"{'TTFT cached, resent image':<34}{h * 1000:>11.1f} ms  {ratio:.1f}x faster (target >= {args.target:g}x) "
          f"{'ok' if ok else 'MISSED'}")
    print(f"{'cached == cold (greedy text)':<34}{str(exact):>14}  {'ok' if exact else 'MISSED'}")
    if not ok:
        missed.append("cached TTFT")
    if not exact:
        missed.append("cached == cold")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    print("all targets met" if not missed else f"MISSED: {'; '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
