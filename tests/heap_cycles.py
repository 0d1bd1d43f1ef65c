"""Run by tests/test_heap.py in a fresh interpreter: load, generate and unload a model four times, print RSS.

Usage: python tests/heap_cycles.py MODEL.gguf CACHE_DIR [--no-trim]
Prints one JSON list: the process's resident set size in bytes after each unload. ``--no-trim`` replaces the
``malloc_trim`` after an unload with a no-op (what the test's figure is without the fix).
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

SYSTEM = "You are a helpful assistant for a memory test. Answer briefly and plainly. " * 6
QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 plus 2?", "Say hello.",
             "What do bees make?", "Name a planet.", "Name a fruit.", "What color is the sky?"]


def rss() -> int:
    """This process's resident set size in bytes (``VmRSS`` of /proc/self/status)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def main(argv: list[str]) -> int:
    os.environ["OLLAPY_CACHE_DIR"] = argv[1]
    from ollapy.engine import model
    from ollapy.options import Options
    from ollapy.runner import loader

    if "--no-trim" in argv:
        model.release_free_heap = lambda: False
    opts = Options(num_ctx=1024, num_parallel=4, temperature=0, num_predict=8)
    ref = loader.PathRef(name="smol", path=Path(argv[0]))
    after_close = []
    for _ in range(4):
        with loader.open_local(ref, opts, cache=True) as m:
            msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
            reqs = [m.submit(m.chat_prompt(mm, opts), opts) for mm in msgs]
            texts = [r.result()[0] for r in reqs]
            assert all(texts) and m.cache_stats().ram_bytes > 0  # real answers; the RAM tier holds states
        gc.collect()  # reference cycles freed now, not at the collector's next threshold
        after_close.append(rss())
    print(json.dumps(after_close))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
