#!/usr/bin/env python3
"""Prompt-cache benchmark (SmolLM2) that judges itself: every target row prints ``ok`` or ``MISSED``.

Rows (time to first token, TTFT, with a ~2,200-token shared system prompt, num_predict=1):

* cold, in process (no cache): the reference;
* RAM hit: target >= 30x faster than cold;
* disk hit, same process (a new PromptCache on the same directory, empty RAM tier): the state file is
  dropped from the page cache first where the OS allows it (fsync + POSIX_FADV_DONTNEED); the label says
  whether it was, as measured by mincore (no target: informational);
* new process, cold (``ollapy run --no-cache``) and new process, disk hit (the cache filled by an earlier
  ``ollapy run`` process, as a shell script would): target >= 25x, model load shown separately; a run
  that reused 0 tokens is MISSED;
* cache on, 0% hits: overhead against cache off in alternating pairs, target < 2%;
* restore: checked read of the state file + llama_state_seq_set_data, the checksum on its own thread during
  the restore as the engine does it (check-then-restore shown beside it), target >= 1 GB/s;
* admission (server-like): N short chats (``--requests``, default 1000; num_predict 4) over 40 distinct
  system prompts of ~270-300 tokens through ONE LoadedModel (num_parallel=4, cache opened by
  ``loader.open_model`` with write_back=False as ``ollapy serve`` does), submitted concurrently in batches of
  8: disk bytes written <= 10% of what a write-everything policy would have written (``bytes_stored``,
  same run; the ratio is about 40/N here, so runs with N under ~450 miss it by construction); then a FRESH
  process binds a new cache on that directory and asks one new question per system prompt: all 40 must
  be disk hits ("cache disk") reusing at least the whole system prompt.

* cached == cold (``--exactness`` prompts per model, default 20; SmolLM2 and Gemma 3): each prompt (a seeded
  random system prompt of 10-100 sentences plus a question, 40 greedy tokens) is answered three times
  through one LoadedModel with its slots emptied in between: cache off, cache on and cold (it fills the
  cache), cache on again (a hit); target: all three identical for every prompt, and every third run a hit;
* canonical order cost: cold TTFT of the ~2,200-token prompt with the last prompt token evaluated alone
  (ollapy/engine/prefix/evalorder.py) against the same prefill with it inside the last chunk (the order before it),
  driven on the backend in alternating pairs; target < 5% slower.

* long prompt (``--long-prompt``, or ``--long-only``; issue 55, meant for Qwen2.5-Coder-1.5B as ``--model``): a
  ~6,000-token prompt (``--long-tokens``) answered by new ``ollapy run`` processes, the first cold (empty cache
  directory; it fills the cache) and ``--repeat`` later ones disk hits: target >= 100x faster to the answer
  (process wall time minus model load, which understates the TTFT ratio), the same ``--long-predict`` greedy
  tokens.

* block pool (``--blocks``, or ``--blocks-only``; scripts/bench_cache_blocks.py, both models, through
  ``ollapy serve`` and ``/metrics``, greedy, num_ctx 8192): one conversation of 10 turns writes <= 1.25x its
  final state; 10 conversations x 3 turns sharing a system prompt write <= 1.5x and hold (disk, RAM) <= 1.5x
  the distinct tokens' KV; the next turn evaluates only the new message (row-invariant build); a 6,000-token
  restore of blocks from disk takes <= 1.2x the whole state's.

The script exits 1 when any target row is MISSED. ``--busy N`` runs everything while N
``python -c "while True: pass"`` processes compete for the CPU (always stopped at the end, also on
SIGTERM). The header prints the load average before and after: timings from a busy machine are noisy.

Usage: python scripts/bench_cache.py [--model PATH] [--repeat N] [--pairs N] [--requests N] [--num-predict N]
                                     [--system-prompts N] [--threads N] [--skip-admission | --admission-only]
                                     [--long-prompt | --long-only] [--long-tokens N] [--long-predict N]
                                     [--busy N] [--keep]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2"

# targets
RAM_SPEEDUP = 30.0
PROCESS_SPEEDUP = 25.0
OVERHEAD_MAX = 0.02
RESTORE_GBPS = 1.0
ADMISSION_MAX_RATIO = 0.10
ORDER_COST_MAX = 0.05
LONG_SPEEDUP = 100.0  # issue 55: a 6,000-token prompt in a new process, disk hit vs cold
GEMMA_MODEL = Path.home() / ".cache/ollapy/test-models/gemma-3-270m-q4_k_m.gguf"

# admission workload
ADMISSION_PROMPTS = 40
ADMISSION_SLOTS = 4
ADMISSION_CTX = 1024
ADMISSION_BATCH = 2 * ADMISSION_SLOTS  # requests submitted at once: every slot busy, as many waiting

TOPICS = ["astronomy", "baking", "chess", "dentistry", "electronics", "falconry", "geology", "hydraulics",
          "insurance", "jazz", "knitting", "linguistics", "meteorology", "navigation", "oceanography",
          "photography", "quilting", "radio", "sailing", "tax law", "urban planning", "viticulture", "welding",
          "xylophones", "yoga", "zoology", "archery", "beekeeping", "calligraphy", "dairy farming", "epidemiology",
          "fencing", "glassblowing", "horology", "ice hockey", "juggling", "kayaking", "locksmithing", "mycology",
          "numismatics"]


# ---- prompts ------------------------------------------------------------------------------------------
def system_prompt(tag: str, n_rules: int = 100) -> str:
    """The long shared system prompt of the TTFT rows (~1,800 tokens at 100 rules)."""
    return f"[{tag}] " + " ".join(
        f"Rule {i}: answer the user's question politely, in one short sentence, and never invent facts."
        for i in range(n_rules))


def admission_system(k: int) -> str:
    """The k-th of the admission run's distinct system prompts (a few hundred tokens; differs from its first word)."""
    topic = TOPICS[k % len(TOPICS)]
    rules = " ".join(f"Guideline {k}.{i}: when a question about {topic} touches point {i}, answer it in one short, "
                     f"accurate sentence." for i in range(10))
    return f"{topic.capitalize()} desk {k}. You are the help desk for {topic}. {rules}"


def admission_question(i: int) -> str:
    """A unique one-line user question."""
    return f"Ticket {i}: what is {i * 7 % 97} plus {i * 13 % 89}?"


# ---- page cache ---------------------------------------------------------------------------------------
def resident_fraction(path: Path) -> float | None:
    """Share of ``path``'s pages in the page cache (mincore on a mapping never touched); None if unknown."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        size = path.stat().st_size
        page = os.sysconf("SC_PAGE_SIZE")
        n = (size + page - 1) // page
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr is None or addr == ctypes.c_void_p(-1).value:
                return None
            try:
                vec = (ctypes.c_ubyte * n)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                return sum(v & 1 for v in vec) / n
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        return None


def drop_page_cache(path: Path) -> float | None:
    """fsync ``path`` and ask the kernel to drop its cached pages; returns the resident share after (None: unknown)."""
    if not hasattr(os, "posix_fadvise"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError:
        return None
    return resident_fraction(path)


# ---- measuring ----------------------------------------------------------------------------------------
def ttft(m, prompt, opts, cache=True) -> tuple[float, object]:
    """Seconds from submit to the first chunk, and the final metrics (read to the end)."""
    t = time.perf_counter()
    req = m.submit(prompt, opts, cache=cache)
    dt = None
    last = None
    for c in req:
        if dt is None:
            dt = time.perf_counter() - t
        last = c
    return dt, last.metrics


def clear(m) -> None:
    """Empty every slot, so the next request cannot reuse a slot's KV."""
    for s in m.engine.slots:
        s.tokens = []
        s.exact = 0
        m.backend.seq_clear(s.id)


def cli_run(model: Path, system: str, question: str, cache_dir: str, extra=(), threads: int = 0,
            num_predict: int = 1, num_ctx: int = 4096, timeout: float = 600) -> dict:
    """One ``ollapy run --verbose`` process, as a shell script would start it; its timings from --verbose.

    ``ttft`` is total duration minus load and eval duration (seconds; with num_predict=1 the eval duration is
    that of the one token after the first); ``text`` is the answer (stdout)."""
    env = dict(os.environ, OLLAPY_CACHE_DIR=cache_dir, OLLAPY_HOST="127.0.0.1:9")
    env.pop("OLLAPY_DEBUG", None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ollapy.cli.main", "run", str(model), "--system", system, "--verbose",
                        "-o", "temperature=0", "-o", f"num_predict={num_predict}", "-o", f"num_ctx={num_ctx}",
                        *(("-o", f"num_thread={threads}") if threads else ()), *extra, question],
                       capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=timeout)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"ollapy run failed ({p.returncode}): {p.stderr}")

    def dur(label: str) -> float:
        mm = re.search(rf"^{label}:\s+([\d.]+)(ms|s|µs)", p.stderr, re.M)  # "eval" is not "prompt eval"
        v = float(mm.group(1))
        return v / 1000 if mm.group(2) == "ms" else v / 1e6 if mm.group(2) == "µs" else v

    mm = re.search(r"prompt cache:\s+(\d+) token\(s\) reused(?: \(([^),]*)[^)]*\))?", p.stderr)
    load = dur("load duration")
    n_prompt = int(re.search(r"prompt eval count:\s+(\d+)", p.stderr).group(1))
    ttft_s = dur("total duration") - load - (dur("eval duration") if num_predict > 1 else 0.0)
    return {"wall": wall, "load": load, "ttft": ttft_s, "reused": int(mm.group(1)),
            "source": mm.group(2) or ("none" if mm.group(1) == "0" else "?"), "text": p.stdout.strip(),
            "n_prompt": n_prompt, "prompt_eval": dur("prompt eval duration"), "eval": dur("eval duration"),
            "total": dur("total duration")}


@dataclass
class Row:
    """One line of the table: ``verdict`` None for rows without a target."""

    case: str
    value: str
    detail: str = ""
    target: str = ""
    verdict: bool | None = None


class Rows(list):
    """The table so far; every row is also printed to stderr as it is measured (a long run shows progress)."""

    def append(self, row: Row) -> None:
        super().append(row)
        print(f"[{time.strftime('%H:%M:%S')}] {row.case}: {row.value} {row.target} {verdict_text(row.verdict)}",
              file=sys.stderr, flush=True)

    def extend(self, rows) -> None:
        for r in rows:
            self.append(r)


def verdict_text(v: bool | None) -> str:
    return "" if v is None else ("ok" if v else "MISSED")


def ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


# ---- phases -------------------------------------------------------------------------------------------
def restore_state(backend, f: Path, overlap: bool) -> float:
    """Seconds to restore state file ``f`` into sequence 0: header, mapped payload, crc32 and state_set.

    ``overlap`` is the engine's way (the checksum runs on its own thread during
    ``llama_state_seq_set_data``, :class:`ollapy.cache.fileformat.PayloadCheck`);
    without it the checksum is verified first (``read_payload``).
    """
    from ollapy.cache.fileformat import PayloadCheck, map_payload, read_header, read_payload

    t = time.perf_counter()
    hdr = read_header(f)
    if overlap:
        view = map_payload(hdr)
        check = PayloadCheck(view, hdr.payload_crc32)
        restored = backend.state_set(0, view)
        assert check.ok() and restored
    else:
        assert backend.state_set(0, read_payload(hdr))
    return time.perf_counter() - t


def ttft_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """In-process rows (cold, 0% hits, RAM hit, same-process disk hit, restore) on one LoadedModel."""
    from ollapy.cache import PromptCache
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options
    from ollapy.runner.loader import PathRef

    opts = Options(num_ctx=4096, temperature=0, num_predict=1, num_thread=args.threads)
    ref = PathRef(name=MODEL_NAME, path=args.model)
    med = statistics.median
    with LoadedModel(args.model, opts, name=MODEL_NAME) as m:
        info = m.info()
        facts["model_name"] = m.backend.meta("general.name") or info["description"]
        facts["description"] = info["description"]
        facts["threads"] = info["threads"]
        sysp = system_prompt("shared")
        q = [f"Question {i}: what is the capital of France?" for i in range(20)]
        p = lambda s, qq: m.chat_prompt([{"role": "system", "content": s}, {"role": "user", "content": qq}])  # noqa: E731
        first = p(sysp, q[0])
        facts["n_prompt"], facts["n_system"] = len(first.tokens), first.keep

        clear(m)
        ttft(m, p(system_prompt("warmup", 5), q[0]), opts, cache=False)
        cold = []
        for i in range(args.repeat):
            clear(m)
            cold.append(ttft(m, p(sysp, q[i]), opts, cache=False)[0])
        t_cold = med(cold)
        rows.append(Row("cold, in process (cache off)", ms(t_cold), f"median of {args.repeat}"))

        # 0% hits: cache on, every system prompt new (the store at the save point, written through, and the
        # RAM-only store at the end included), against the cache off, in alternating pairs with prompts of the
        # same length: machine drift hits both sides alike
        miss_cache = PromptCache(ref, opts, root=tmp / "miss").bind(m)
        in_cache = [0.0]  # seconds the engine thread spent inside the cache: the direct cost

        def timed(fn):
            def call(*a, **k):
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    in_cache[0] += time.perf_counter() - t
            return call

        for name in ("peek", "load", "store", "record_hit", "record_miss", "record_refused"):
            setattr(miss_cache, name, timed(getattr(miss_cache, name)))
        pairs = []
        miss_sources = collections.Counter()
        for i in range(args.pairs):
            one = {}
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                m.engine.cache = miss_cache if on else None
                clear(m)
                dt, met = ttft(m, p(system_prompt(f"{'m' if on else 'c'}{i:03d}"), q[i % len(q)]), opts, cache=on)
                one[on] = dt
                if on:
                    miss_sources[met.prefix_source] += 1
            pairs.append((one[False], one[True]))
        m.engine.cache = None
        miss_snap = miss_cache.snapshot()
        miss_cache.close()
        off_med, on_med = med(t for t, _ in pairs), med(t for _, t in pairs)
        overhead = med(on / off for off, on in pairs) - 1
        per_req = in_cache[0] / args.pairs
        facts["late_rows"] = [Row("cache on, 0% hits (overhead)", f"{overhead * 100:+.1f}%",
                        f"median of {args.pairs} alternating off/on pairs: {ms(off_med)} vs {ms(on_med)}; "
                        f"engine thread in the cache {per_req * 1000:.1f} ms/request "
                        f"({per_req / off_med * 100:.2f}% of cold); misses {miss_snap.misses}, "
                        f"hits {miss_snap.hits_ram + miss_snap.hits_disk}",
                        "< 2%", overhead < OVERHEAD_MAX and miss_snap.hits_ram + miss_snap.hits_disk == 0)]

        # RAM hit: the first request stores (system prompt state written through, final state in RAM)
        hit_root = tmp / "hit"
        c = PromptCache(ref, opts, root=hit_root).bind(m)
        m.engine.cache = c
        clear(m)
        ttft(m, p(sysp, q[0]), opts)
        c.flush()
        ram, ram_src, ram_reused = [], collections.Counter(), []
        for i in range(args.repeat):
            clear(m)
            dt, met = ttft(m, p(sysp, q[1 + i]), opts)
            ram.append(dt)
            ram_src[met.prefix_source] += 1
            ram_reused.append(met.prompt_cache_tokens)
        m.engine.cache = None
        c.close()
        t_ram = med(ram)
        all_ram = ram_src["cache ram"] == args.repeat
        rows.append(Row("RAM hit", ms(t_ram),
                        f"{t_cold / t_ram:.1f}x vs cold; reused {min(ram_reused)} tok; sources {dict(ram_src)}",
                        f">= {RAM_SPEEDUP:.0f}x", all_ram and t_cold / t_ram >= RAM_SPEEDUP))

        # disk hit in this process: a new PromptCache on the directory each time (empty RAM tier)
        files = sorted(hit_root.rglob("*.kv"))
        disk, disk_src, disk_reused, resident = [], collections.Counter(), [], []
        for i in range(args.repeat):
            res = [drop_page_cache(f) for f in files]
            resident.append(None if any(r is None for r in res) or not res else max(res))
            dc = PromptCache(ref, opts, root=hit_root).bind(m)
            m.engine.cache = dc
            clear(m)
            dt, met = ttft(m, p(sysp, q[5 + i]), opts)
            m.engine.cache = None
            dc.close()
            disk.append(dt)
            disk_src[met.prefix_source] += 1
            disk_reused.append(met.prompt_cache_tokens)
        t_disk = med(disk)
        if any(r is None for r in resident):
            label = "file in the page cache (could not drop it)"
        elif max(resident) == 0:
            label = "page cache dropped: 0% resident"
        else:
            label = f"page cache drop partial: up to {max(resident) * 100:.0f}% resident"
        facts["disk_label"] = label
        rows.append(Row(f"disk hit, same process ({label})", ms(t_disk),
                        f"{t_cold / t_disk:.1f}x vs cold; reused {min(disk_reused)} tok; sources {dict(disk_src)}"))

        # restore throughput: checked read of the state file + llama_state_seq_set_data, as the engine does it
        # (checksum on its own thread during the restore), vs a plain read and vs check-then-restore
        f = max(files, key=lambda x: x.stat().st_size)
        size = f.stat().st_size
        plain, restore, serial = [], [], []
        for _ in range(5):
            t = time.perf_counter()
            with open(f, "rb") as fh:
                fh.read()
            plain.append(time.perf_counter() - t)
            restore.append(restore_state(m.backend, f, overlap=True))
            serial.append(restore_state(m.backend, f, overlap=False))
        cold_restore = None
        if drop_page_cache(f) == 0:
            cold_restore = restore_state(m.backend, f, overlap=True)
        gbps = size / med(restore) / 1e9
        mb = size / 1e6
        detail = (f"state file {mb:.1f} MB in the page cache, {ms(med(restore))}; plain read {mb / med(plain):.0f} MB/s, "
                  f"check then restore {size / med(serial) / 1e9:.2f} GB/s")
        if cold_restore is not None:
            detail += f"; after dropping the page cache {size / cold_restore / 1e9:.2f} GB/s"
        facts["late_rows"].append(Row("restore (checked read + state_set)", f"{gbps:.2f} GB/s", detail,
                        f">= {RESTORE_GBPS:.0f} GB/s", gbps >= RESTORE_GBPS))
        facts["t_cold"] = t_cold
        facts["sysp"] = sysp
        facts["q"] = q


def process_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """New ``ollapy run`` processes: cold (--no-cache) against a disk hit on a cache an earlier process filled."""
    sysp, q = facts["sysp"], facts["q"]
    cli_dir = str(tmp / "cli")
    # one earlier process fills the cache: the system prompt's state at once, its final state at close
    fill = cli_run(args.model, sysp, q[10], cli_dir, threads=args.threads)
    cold, hit = [], []
    for i in range(args.repeat):  # interleaved: drift hits both sides alike
        cold.append(cli_run(args.model, sysp, q[11 + i], cli_dir, ("--no-cache",), threads=args.threads))
        hit.append(cli_run(args.model, sysp, q[15 + i], cli_dir, threads=args.threads))
    med = statistics.median
    t_cold, t_hit = med(r["ttft"] for r in cold), med(r["ttft"] for r in hit)
    min_reused = min(r["reused"] for r in hit)
    sources = dict(collections.Counter(r["source"] for r in hit))
    rows.append(Row("new process, cold (--no-cache)", ms(t_cold),
                    f"median of {args.repeat}; model load {ms(med(r['load'] for r in cold))} (not in TTFT); "
                    f"wall {med(r['wall'] for r in cold):.2f} s"))
    speed = t_cold / t_hit
    rows.append(Row(f"new process, disk hit ({min_reused} tok reused)", ms(t_hit),
                    f"{speed:.1f}x vs new-process cold; model load {ms(med(r['load'] for r in hit))} (not in TTFT); "
                    f"wall {med(r['wall'] for r in hit):.2f} s; sources {sources}; filled by one earlier `ollapy run` "
                    f"(its TTFT {ms(fill['ttft'])}, reused {fill['reused']} tok)",
                    f">= {PROCESS_SPEEDUP:.0f}x, > 0 tok", min_reused > 0 and speed >= PROCESS_SPEEDUP))


def long_prompt_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """A ~6,000-token prompt (``--long-tokens``) in new ``ollapy run`` processes: the first one cold (an empty
    cache directory: nothing to reuse; it fills the cache, as a user's first run does) against disk hits (median of
    ``--repeat``) by later processes; the answers (``--long-predict`` greedy tokens) must be identical. Target
    >= 100x faster to the first token (issue 55). The cold run is not repeated: it takes minutes on a 1.5B model
    on 2 cores."""
    n_rules = max(1, round(args.long_tokens / 22.6))  # ~22.6 Qwen2.5 tokens per rule
    sysp = system_prompt("long", n_rules)
    q = "Which rule number comes right after Rule 41? Answer with the number only, then explain in one sentence."
    cli_dir = str(tmp / "long")
    kw = dict(threads=args.threads, num_predict=args.long_predict, num_ctx=8192, timeout=7200)
    facts.setdefault("model_name", args.model.stem)
    cold = cli_run(args.model, sysp, q, cli_dir, **kw)
    hit = [cli_run(args.model, sysp, q, cli_dir, **kw) for _ in range(args.repeat)]
    med = statistics.median
    # judged on the process's wall time to its answer minus the model's load: the answer's few tokens and the
    # interpreter's start are in both sides (so the ratio understates the TTFT speed-up); the --verbose figures
    # are shown beside it
    answer = lambda r: r["wall"] - r["load"]  # noqa: E731
    t_hit = med(answer(r) for r in hit)
    same = all(r["text"] == cold["text"] for r in hit)
    min_reused = min(r["reused"] for r in hit)
    sources = dict(collections.Counter(r["source"] for r in hit))
    verbose = lambda r: (f"--verbose: total {r['total']:.2f} s, load {r['load']:.2f} s, prompt eval "  # noqa: E731
                         f"{r['prompt_eval']:.2f} s, eval {r['eval']:.2f} s")
    rows.append(Row(f"long prompt, new process, cold ({cold['n_prompt']} tok, {cold['reused']} reused)",
                    f"{answer(cold):.2f} s", f"wall minus model load; one run, empty cache directory (it fills it); "
                    f"wall {cold['wall']:.1f} s; {verbose(cold)}; answer ({args.long_predict} greedy tokens at most): "
                    f"{cold['text'][:160]!r}"))
    speed = answer(cold) / t_hit
    rows.append(Row(f"long prompt, new process, disk hit ({min_reused} tok reused)", f"{t_hit:.2f} s",
                    f"{speed:.1f}x vs the cold process (wall minus model load, median of {args.repeat}); "
                    f"wall {med(r['wall'] for r in hit):.2f} s; first hit's {verbose(hit[0])}; sources {sources}; "
                    f"answers identical to the cold one: {same}",
                    f">= {LONG_SPEEDUP:.0f}x, same answer",
                    cold["reused"] == 0 and min_reused > 0 and same and speed >= LONG_SPEEDUP))


def exact_prompt(rng: random.Random) -> str:
    """A seeded random fact list of 10-100 sentences (the kind of system prompt a script sends)."""
    subjects = ["The courier", "The keeper", "A clerk", "The pilot", "The baker", "A guard", "The mayor"]
    things = ["street", "house", "ship", "bridge", "kettle", "book", "tower", "garden"]
    return " ".join(f"{rng.choice(subjects)} with badge {rng.randrange(100)} visits {rng.choice(things)} "
                    f"{rng.randrange(300)}." for _ in range(rng.randrange(10, 101)))


def exactness_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """cached == cold over many prompts per model, and the cost of the canonical evaluation order."""
    from ollapy.engine.prefix.evalorder import next_chunk_end
    from ollapy.options import Options
    from ollapy.runner.loader import PathRef, open_model

    opts = Options(num_ctx=4096, temperature=0, num_predict=40, num_thread=args.threads)
    models = [("SmolLM2", args.model), ("Gemma 3", GEMMA_MODEL)]
    models = [m for m in models if args.exactness_model in ("both", m[0].split()[0].lower())]
    for label, path in models:
        if not path.exists():
            rows.append(Row(f"cached == cold ({label})", "skipped", f"{path} not found", f"{args.exactness}/"
                            f"{args.exactness}", False))
            continue
        os.environ["OLLAPY_CACHE_DIR"] = str(tmp / f"exact-{label.split()[0]}")
        rng = random.Random(7)
        same = hits = 0
        with open_model(PathRef(name=label.split()[0].lower(), path=path), opts, isolated=False) as m:
            for _ in range(args.exactness):
                system = exact_prompt(rng)
                p = m.chat_prompt([{"role": "system", "content": system},
                                   {"role": "user", "content": "Which badge visits the tower? Answer in one sentence."}],
                                  opts)
                texts, reused = [], []
                for cache in (False, True, True):
                    clear(m)
                    req = m.submit(p, opts, cache=cache)
                    texts.append("".join(c.text for c in req))
                    reused.append(req.metrics.prompt_cache_tokens)
                same += texts[0] == texts[1] == texts[2]
                if not texts[0] == texts[1] == texts[2]:
                    print(f"{label}: answers differ for a {len(p.tokens)}-token prompt (reused {reused}): "
                          f"{texts!r}", file=sys.stderr)
                hits += reused[2] > 0 and reused[1] == 0
        rows.append(Row(f"cached == cold ({label})", f"{same}/{args.exactness}",
                        f"identical answers (cache off, cold, hit); {hits}/{args.exactness} third runs were hits",
                        f"{args.exactness}/{args.exactness}", same == args.exactness and hits == args.exactness))
    # the canonical order's TTFT cost, on the backend: last prompt token alone vs inside the last chunk
    from array import array

    from ollapy.engine.backend.context import Backend, ContextConfig

    b = Backend(args.model, ContextConfig(num_ctx=4096, flash_attn="off"))
    try:
        toks = b.tokenize(facts.get("sysp") or system_prompt("order"))
        n = len(toks)

        def decode(start: int, end: int, last: bool) -> None:
            k = end - start
            b.decode(array("i", toks[start:end]), array("i", range(start, end)), array("i", [0] * k),
                     array("b", [0] * (k - 1) + [1 if last else 0]))

        def canonical() -> None:
            start = 0
            while start < n - 1:
                end = next_chunk_end(start, n - 1, b.n_ubatch)
                decode(start, end, False)
                start = end
            decode(n - 1, n, True)

        def legacy() -> None:
            for start in range(0, n, b.n_ubatch):
                decode(start, min(n, start + b.n_ubatch), min(n, start + b.n_ubatch) == n)

        t_c, t_l = [], []
        for _ in range(args.pairs):
            for fn, out in ((legacy, t_l), (canonical, t_c)):
                b.seq_clear(0)
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        cost = statistics.median(t_c) / statistics.median(t_l) - 1
        rows.append(Row("canonical order, cold TTFT", ms(statistics.median(t_c)),
                        f"{cost * 100:+.1f}% vs last token inside its chunk ({ms(statistics.median(t_l))}); "
                        f"{n} prompt tokens, median of {args.pairs} alternating pairs", f"< {ORDER_COST_MAX:.0%}",
                        cost < ORDER_COST_MAX))
    finally:
        b.close()


def admission_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """Server-like run, then a fresh process checks that every system prompt is a disk hit."""
    from ollapy.cache.tiers import disk_usage
    from ollapy.options import Options
    from ollapy.runner import loader
    from ollapy.runner.loader import PathRef

    root = tmp / "admission"
    n = args.requests
    n_sys = min(args.system_prompts, n)
    os.environ["OLLAPY_CACHE_DIR"] = str(root)  # open_model takes the cache directory from the settings
    ref = PathRef(name=MODEL_NAME, path=args.model)
    opts = Options(num_ctx=ADMISSION_CTX, num_parallel=ADMISSION_SLOTS, temperature=0, num_predict=args.num_predict,
                   num_thread=args.threads)
    order = [i % n_sys for i in range(n)]
    random.Random(1234).shuffle(order)
    sources: collections.Counter = collections.Counter()
    t0 = time.perf_counter()
    m = loader.open_model(ref, opts, cache=True, write_back=False)
    try:
        info = m.info()
        facts.setdefault("model_name", m.backend.meta("general.name") or info["description"])
        facts.setdefault("description", info["description"])
        facts.setdefault("threads", info["threads"])
        t1 = time.perf_counter()
        for b in range(0, n, ADMISSION_BATCH):
            reqs = [m.chat([{"role": "system", "content": admission_system(order[i])},
                            {"role": "user", "content": admission_question(i)}], opts)
                    for i in range(b, min(n, b + ADMISSION_BATCH))]
            for r in reqs:
                _, last = r.result()
                sources[last.metrics.prefix_source] += 1
            done = min(n, b + ADMISSION_BATCH)
            if done % 100 < ADMISSION_BATCH or done == n:
                print(f"admission: {done}/{n} chats, {time.perf_counter() - t1:.0f} s", file=sys.stderr, flush=True)
        t_run = time.perf_counter() - t1
    finally:
        m.close()
    t_close = time.perf_counter() - t0 - t_run
    snap = m.cache.snapshot()
    usage = disk_usage(root)
    ratio = snap.bytes_written / snap.bytes_stored if snap.bytes_stored else 0.0
    facts["admission_s"] = t_run
    rows.append(Row("admission: disk bytes written", f"{ratio * 100:.1f}%",
                    f"{snap.bytes_written / 1e6:.0f} MB in {snap.files_written} files vs write-everything "
                    f"{snap.bytes_stored / 1e6:.0f} MB in {snap.stores} states; {n} chats over {n_sys} system prompts, "
                    f"{ADMISSION_SLOTS} slots, batches of {ADMISSION_BATCH}, num_predict={args.num_predict}: "
                    f"{t_run:.1f} s ({n / t_run:.1f} req/s; load+close {t_close:.1f} s); sources {dict(sources)}; "
                    f"hits ram {snap.hits_ram}, disk {snap.hits_disk}, misses {snap.misses}; on disk now "
                    f"{usage['disk_files']} files {usage['disk_bytes'] / 1e6:.0f} MB",
                    "<= 10% of write-everything", snap.bytes_stored > 0 and ratio <= ADMISSION_MAX_RATIO))

    # a new process's view: a fresh interpreter binds a new PromptCache on the same directory
    t = time.perf_counter()
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--model", str(args.model),
                        "--verify-admission", str(root), "--threads", str(args.threads), "--requests", str(n),
                        "--system-prompts", str(n_sys)],
                       capture_output=True, text=True, cwd=str(ROOT), timeout=900)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"admission check process failed ({p.returncode}): {p.stderr}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    got = [r for r in res["results"] if r["source"] == "cache disk" and r["reused"] >= r["system_tokens"]]
    srcs = collections.Counter(r["source"] for r in res["results"])
    rows.append(Row("admission: new process, system prompts hit", f"{len(got)}/{n_sys}",
                    f"fresh process, new PromptCache on the directory, one new question per system prompt: "
                    f"sources {dict(srcs)}, reused {min(r['reused'] for r in res['results'])}-"
                    f"{max(r['reused'] for r in res['results'])} tok (system prompts "
                    f"{min(r['system_tokens'] for r in res['results'])}-"
                    f"{max(r['system_tokens'] for r in res['results'])}); median TTFT {ms(res['ttft_median'])}; "
                    f"process wall {wall:.1f} s", f"{n_sys}/{n_sys} disk hits", len(got) == n_sys))


def verify_admission(args) -> None:
    """(Child process.) One new question per admission system prompt on a new cache; prints one JSON line."""
    from ollapy.options import Options
    from ollapy.runner import loader
    from ollapy.runner.loader import PathRef

    os.environ["OLLAPY_CACHE_DIR"] = args.verify_admission
    ref = PathRef(name=MODEL_NAME, path=args.model)
    opts = Options(num_ctx=ADMISSION_CTX, num_parallel=ADMISSION_SLOTS, temperature=0, num_predict=1,
                   num_thread=args.threads)
    out = []
    with loader.open_model(ref, opts, cache=True, write_back=False) as m:
        for k in range(min(args.system_prompts, args.requests)):
            prompt = m.chat_prompt([{"role": "system", "content": admission_system(k)},
                                    {"role": "user", "content": f"A new visitor, number {k}, asks: where is the exit?"}])
            dt, met = ttft(m, prompt, opts)
            out.append({"k": k, "source": met.prefix_source, "reused": met.prompt_cache_tokens,
                        "system_tokens": prompt.keep, "ttft": dt})
        snap = m.cache.snapshot()
    print(json.dumps({"results": out, "ttft_median": statistics.median(r["ttft"] for r in out),
                      "stats": snap.as_dict()}))


# ---- main ---------------------------------------------------------------------------------------------
def block_pool_rows(args, tmp: Path, rows: list[Row], facts: dict) -> None:
    """The block-pool rows of scripts/bench_cache_blocks.py, for SmolLM2 (``--model``) and Gemma 3."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_cache_blocks import block_rows

    for case, value, detail, target, verdict in block_rows(tmp, [("smollm2", args.model), ("gemma", GEMMA_MODEL)]):
        rows.append(Row(case, value, detail, target, verdict))


def start_busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            p.kill()
        except OSError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--repeat", type=int, default=3, help="repeats per TTFT row (median)")
    ap.add_argument("--pairs", type=int, default=8, help="cache-off/cache-on pairs for the 0%% hit overhead")
    ap.add_argument("--requests", type=int, default=1000, help="chats in the admission run")
    ap.add_argument("--num-predict", type=int, default=4, help="tokens generated per admission chat")
    ap.add_argument("--system-prompts", type=int, default=ADMISSION_PROMPTS,
                    help="distinct system prompts in the admission run (at most %(default)s)")
    ap.add_argument("--threads", type=int, default=0,
                    help="llama.cpp threads (num_thread) for every model this script loads; 0: the backend's default")
    ap.add_argument("--exactness", type=int, default=20, help="prompts per model in the cached == cold rows")
    ap.add_argument("--exactness-model", choices=["both", "smollm2", "gemma"], default="both",
                    help="models in the cached == cold rows")
    ap.add_argument("--skip-admission", action="store_true", help="leave out the admission rows")
    ap.add_argument("--admission-only", action="store_true", help="only the admission rows")
    ap.add_argument("--exactness-only", action="store_true", help="only the exactness rows")
    ap.add_argument("--blocks", action="store_true", help="add the block-pool rows (both models, ollapy serve)")
    ap.add_argument("--blocks-only", action="store_true", help="only the block-pool rows")
    ap.add_argument("--long-prompt", action="store_true",
                    help="add the long-prompt rows (new processes, ~--long-tokens prompt, disk hit vs cold)")
    ap.add_argument("--long-only", action="store_true", help="only the long-prompt rows")
    ap.add_argument("--long-tokens", type=int, default=6000, help="prompt length of the long-prompt rows")
    ap.add_argument("--long-predict", type=int, default=24, help="greedy tokens compared in the long-prompt rows")
    ap.add_argument("--busy", type=int, default=0, help="run N CPU busy loops for the whole benchmark")
    ap.add_argument("--keep", action="store_true", help="keep the temporary cache directories")
    ap.add_argument("--verify-admission", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model.expanduser().resolve()
    args.system_prompts = max(1, min(args.system_prompts, len(TOPICS)))
    if args.verify_admission:
        verify_admission(args)
        return 0

    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    os.environ["OLLAPY_CACHE_DIR"] = str(tmp / "default")
    rows = Rows()
    facts: dict = {}
    phases: list[tuple[str, float]] = []
    phase_list = [("in-process rows", ttft_rows), ("new-process rows", process_rows),
                  ("exactness rows", exactness_rows), ("admission rows", admission_rows)]
    extra_phases = []
    if args.blocks or args.blocks_only:
        extra_phases.append(("block-pool rows", block_pool_rows))
    if args.long_prompt or args.long_only:
        extra_phases.append(("long-prompt rows", long_prompt_rows))
    if args.long_only or args.blocks_only:
        phase_list = [p for p in extra_phases if (p[1] is long_prompt_rows and args.long_only)
                      or (p[1] is block_pool_rows and args.blocks_only)]
    elif args.admission_only:
        phase_list = phase_list[3:] + extra_phases
    elif args.exactness_only:
        phase_list = phase_list[2:3] + extra_phases
    elif args.skip_admission:
        phase_list = phase_list[:3] + extra_phases
        rows_skipped = [Row("admission rows", "skipped", "--skip-admission")]
    else:
        phase_list += extra_phases
    load_before = os.getloadavg()

    def terminated(signum, _frame):
        raise SystemExit(f"bench_cache: stopped by signal {signum}; rows so far:\n"
                         + "\n".join(f"  {r.case}: {r.value} {r.target} {verdict_text(r.verdict)}" for r in rows))

    signal.signal(signal.SIGTERM, terminated)  # the finally below still stops the busy loops and removes the files
    busy = start_busy(args.busy)
    try:
        for name, fn in phase_list:
            t = time.perf_counter()
            fn(args, tmp, rows, facts)
            phases.append((name, time.perf_counter() - t))
            if fn is process_rows:  # overhead and restore rows after the TTFT rows
                rows.extend(facts.pop("late_rows", []))
    finally:
        stop_busy(busy)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - t_start
    load_after = os.getloadavg()
    if args.skip_admission:
        rows.extend(rows_skipped)

    print()
    print(f"model: {facts.get('model_name', '?')} ({facts.get('description', '?')}), file {args.model.name}; "
          f"llama.cpp threads {facts.get('threads', '?')} (CPUs {os.cpu_count()}); busy loops {args.busy}")
    print(f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after"
          + (" -- other processes competed for the CPU: timings are noisy"
             if max(load_before[0], load_after[0]) > (os.cpu_count() or 1) + args.busy else ""))
    if "n_prompt" in facts:
        print(f"TTFT rows: prompt {facts['n_prompt']} tokens (system prompt {facts['n_system']}), num_predict=1, "
              f"median of {args.repeat}")
    w = max(len(r.case) for r in rows)
    print(f"{'case':<{w}}  {'result':>10}  {'target':<28} {'':<6}")
    for r in rows:
        print(f"{r.case:<{w}}  {r.value:>10}  {r.target:<28} {verdict_text(r.verdict):<6}")
        if r.detail:
            print(f"{'':<{w}}    {r.detail}")
    print("time: " + ", ".join(f"{n} {s:.0f} s" for n, s in phases) + f"; total {total:.0f} s"
          + (f" (cache dirs kept in {tmp})" if args.keep else ""))
    missed = [r.case for r in rows if r.verdict is False]
    print("all targets met" if not missed else f"MISSED: {'; '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
