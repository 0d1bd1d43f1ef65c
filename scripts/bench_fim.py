#!/usr/bin/env python
"""Benchmark code completion (fill-in-the-middle) as editors drive it: a keystroke trace (issue 52, "Done when").

The trace types one 60-character line, a word at a time, into a real source file of about 3,000 tokens (a module
of the Python standard library, read at run time: ``cmd.py`` of the interpreter running this script, 3,112 tokens
for Qwen2.5-Coder in Python 3.11, unless ``--file`` names another), 90% of the way down, with a completion request
after each word, one at a time, as an editor sends them. Two request shapes, taken from the clients' sources:

* llama.vscode (``src/llama-server.ts``, ``createRequestPayload``; llama.vim sends the same fields): ``POST
  /infill`` with ``input_extra`` (its ring buffer: chunks of 32 lines of another file, here ``heapq.py``),
  ``input_prefix`` (the 256 lines above the cursor's line), ``input_suffix`` (the rest of the line and the 64 lines
  below), ``prompt`` (the text typed on the line so far), ``n_indent``, ``top_k`` 40, ``top_p`` 0.99, ``samplers``
  ``["top_k", "top_p", "infill"]``, ``cache_prompt`` true. Before the trace, the ring-buffer update request
  (``n_predict`` 0) the client sends when its chunks change. Run on ollapy and on llama-server ``--cache-reuse
  256`` (same llama.cpp, built by ``scripts/build_native_baselines.sh``), request by request in turn, so both see
  the same load.
* Continue's Ollama provider (``core/llm/llms/Ollama.ts``, ``_streamFim``): ``POST /api/generate`` with ``prompt``
  the whole file before the cursor (the typed text included), ``suffix`` the rest, ``options`` {``temperature``,
  ``num_predict``, ``stop`` (its Qwen list), ``num_ctx`` 8192}, ``keep_alive`` 1800, streamed; on ollapy.

Deviations from the clients, for a measurement that can be repeated: greedy (``temperature`` 0), ``n_predict``
``--n-predict`` (16) instead of 128, llama.vscode's ``n_cmpl`` 3 (three completions) and ``t_max_predict_ms`` left
out (a clock-dependent cut would make completions differ from run to run), streamed (time to first token is read
on the wire), ``--extra-chunks`` (4) ring-buffer chunks instead of up to 16.

Rows (``ok``/``MISSED`` with the target; exit status 1 on a miss):

1. TTFT p50/p95 and tokens prefilled per request, llama.vscode shape, ollapy vs llama-server: ollapy p50 <= 1.0x.
2. The Continue shape on ollapy vs a full re-prefill of each request (the same request with nothing reused:
   another prompt through the slot first, ``cache`` false; what Ollama, which keeps no prefix across a change
   before the suffix, does): warm p50 >= 3x faster (5x with ``--continue-layout moved-line``).
3. Every completion of both traces vs the same request cold (above): identical.
4. Bytes the prompt cache took over each trace (``bytes_stored`` in ``/api/ps``'s ``prompt_cache``: states copied
   out of llama.cpp, before block dedupe; the disk tier's bytes shown beside) <= 1.5x the file's KV (the file's
   tokens x ``kv_bytes_per_token``).
5. A cancelled completion frees its slot: a long streamed completion, closed by the client after a few tokens;
   the time from the close until ``/api/ps`` (polled on a kept-alive connection) shows no busy slot <= one decode
   step (the stream's median gap between tokens). The next request, sent at the close, is timed beside the same
   request on an idle slot: what it waited for the cancelled one.

An ``info`` row (no target) gives the llama.vscode shape with the ``fim_layout`` option ``moved-line`` (an ollapy
extension field ``options`` on ``/infill``): the opt-in layout that prefills only the typed text, at the cost in
right answers that ``scripts/compare_fim_layouts.py`` measures.

    python scripts/bench_fim.py --native-bin ~/.cache/ollapy/native/build/bin
    python scripts/bench_fim.py --quick      # a smoke run: bisect.py (883 tokens), 3 words, 1 chunk, the last
                                             # request of each shape checked cold

Starts both servers on free loopback ports (temporary store and cache; ``OLLAPY_NUM_PARALLEL=1`` and llama-server
``-np 1``, 8192 tokens of context each, the same threads, weight repacking off in both) and stops them at exit.
Not part of CI: minutes on 2 cores (the cold requests prefill the whole prompt).
"""
from __future__ import annotations

import argparse
import bisect
import cmd
import heapq
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
NUM_CTX = 8192  # Continue's default num_ctx for the Ollama provider; llama-server's slot gets the same
# Continue's stop strings for Qwen2.5-Coder (core/autocomplete/templating/AutocompleteTemplate.ts) plus its common
# ones (getStopTokens.ts)
CONTINUE_STOP = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>", "/src/", "#- coding: utf-8", "```"]
TYPED_CODE = "width = sum(len(s) for s in list) + 2 * (len(list) - 1) + padding"  # cut to 60 characters with its indentation


# ---- the trace ---------------------------------------------------------------------------------------------
@dataclass
class Trace:
    """A file and the line typed into it: ``lines`` the file, ``at`` the index the new line goes before,
    ``indent`` its indentation, ``steps`` the text typed after each word (indentation included)."""

    lines: list[str]
    at: int
    indent: str
    steps: list[str]

    def prefix_lines(self) -> list[str]:
        return self.lines[: self.at]

    def suffix_lines(self) -> list[str]:
        return self.lines[self.at:]


def make_trace(text: str, words: int | None) -> Trace:
    """The trace over ``text``: the new line goes before the first non-blank line at or after 90% of the file,
    with that line's indentation; 60 characters in all, typed a word at a time."""
    lines = text.split("\n")
    at = int(len(lines) * 0.9)
    while at < len(lines) - 1 and not lines[at].strip():
        at += 1
    nxt = lines[at]
    indent = nxt[: len(nxt) - len(nxt.lstrip())]
    line = (indent + TYPED_CODE)[:60]
    assert len(line) == 60, len(line)
    parts = line[len(indent):].split(" ")
    steps = [indent + " ".join(parts[: i + 1]) for i in range(len(parts))]
    return Trace(lines, at, indent, steps[:words] if words else steps)


def ring_chunks(text: str, n: int, name: str) -> list[dict]:
    """llama.vscode's ring buffer: ``n`` chunks of 32 lines (its ``ring_chunk_size`` 64 / 2) of another file, with
    its ``{"text", "time", "filename"}`` fields."""
    lines = text.split("\n")
    step = max(32, len(lines) // max(n, 1))
    return [{"text": "\n".join(lines[i * step: i * step + 32]) + "\n", "time": 1700000000000 + i, "filename": name}
            for i in range(n)]


def vscode_body(tr: Trace, typed: str, chunks: list[dict], n_predict: int, model: str) -> dict:
    """llama.vscode's ``/infill`` body for the cursor at the end of ``typed`` (see the module docstring)."""
    prefix = tr.prefix_lines()[-256:]
    suffix = tr.suffix_lines()[:64]
    return {"id_slot": 0, "input_prefix": "\n".join(prefix) + "\n", "input_suffix": "\n" + "\n".join(suffix) + "\n",
            "input_extra": chunks, "prompt": typed, "n_predict": n_predict, "top_k": 40, "top_p": 0.99,
            "stream": True, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "n_indent": len(tr.indent), "temperature": 0, "t_max_prompt_ms": 500, "model": model}


def vscode_prep_body(chunks: list[dict], model: str) -> dict:
    """llama.vscode's ring-buffer update (``createRequestPayload(noPredict=true)``): no prediction."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "",
            "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1,
            "model": model}


def continue_body(tr: Trace, typed: str, n_predict: int, model: str, layout: str | None) -> dict:
    """Continue's ``/api/generate`` FIM body (``_getGenerateOptions(options, prefix, suffix)``)."""
    prefix = "\n".join(tr.prefix_lines()) + "\n" + typed
    suffix = "\n" + "\n".join(tr.suffix_lines())
    opts = {"temperature": 0, "num_predict": n_predict, "stop": CONTINUE_STOP, "num_ctx": NUM_CTX}
    if layout:
        opts["fim_layout"] = layout
    return {"model": model, "prompt": prefix, "suffix": suffix, "options": opts, "keep_alive": 1800}


# ---- measuring one request --------------------------------------------------------------------------------
@dataclass
class Result:
    ttft: float  # seconds from sending to the first streamed token (or the end, for an empty answer)
    prefilled: int  # prompt tokens the server evaluated (not reused)
    content: str
    total: float
    extra: dict = field(default_factory=dict)


def post_infill(http: httpx.Client, body: dict) -> Result:
    """A streamed ``/infill`` (llama-server's server-sent events, final object last)."""
    t0 = time.perf_counter()
    ttft, text, final = None, [], {}
    with http.stream("POST", "/infill", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/infill: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            d = json.loads(line[6:])
            if "error" in d:
                raise RuntimeError(f"/infill: {d['error']}")
            if ttft is None and (d.get("content") or d.get("stop")):
                ttft = time.perf_counter() - t0
            text.append(d.get("content") or "")
            if d.get("stop"):
                final = d
    total = time.perf_counter() - t0
    return Result(ttft if ttft is not None else total, int(final.get("timings", {}).get("prompt_n", -1)),
                  "".join(text), total, final)


def post_generate(http: httpx.Client, body: dict, cache: bool = True) -> Result:
    """A streamed Ollama ``/api/generate``."""
    t0 = time.perf_counter()
    ttft, text, final = None, [], {}
    with http.stream("POST", "/api/generate", json={**body, "stream": True, "cache": cache}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"/api/generate: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line:
                continue
            d = json.loads(line)
            if "error" in d:
                raise RuntimeError(f"/api/generate: {d['error']}")
            if ttft is None and (d.get("response") or d.get("done")):
                ttft = time.perf_counter() - t0
            text.append(d.get("response") or "")
            if d.get("done"):
                final = d
    total = time.perf_counter() - t0
    prefilled = int(final.get("prompt_eval_count", 0)) - int(final.get("prompt_cache_tokens", 0))
    return Result(ttft if ttft is not None else total, prefilled, "".join(text), total, final)


def flush_slot(http: httpx.Client, model: str) -> None:
    """Put another prompt through ollapy's one slot (no cache), so that the next request reuses nothing."""
    r = http.post("/api/generate", json={"model": model, "prompt": "flush", "raw": True, "stream": False,
                                         "cache": False, "options": {"num_predict": 1, "num_ctx": NUM_CTX}})
    if r.status_code != 200:
        raise RuntimeError(f"flush: HTTP {r.status_code}: {r.text[:300]}")


def ps_model(http: httpx.Client) -> dict:
    models = http.get("/api/ps").json()["models"]
    assert len(models) == 1, models
    return models[0]


def cache_bytes(http: httpx.Client) -> tuple[int, int]:
    """(bytes_stored, bytes_written) of the loaded model's prompt cache."""
    pc = ps_model(http).get("prompt_cache") or {}
    return int(pc.get("bytes_stored", 0)), int(pc.get("bytes_written", 0))


# ---- servers ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, what: str, log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not start in {timeout:.0f} s; see {log}")


def start_ollapy(tmp: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL="1", OLLAPY_CONTEXT_LENGTH=str(NUM_CTX),
               OLLAPY_NUM_THREAD=str(threads), OLLAPY_KEEP_ALIVE="-1", OLLAPY_MODELS=str(tmp / "models"),
               OLLAPY_CACHE_DIR=str(tmp / "cache"), XDG_STATE_HOME=str(tmp / "state"))
    env.pop("OLLAPY_DEBUG", None)
    log = tmp / "ollapy.log"
    proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve", "--allow-paths"], env=env,
                            cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    base = f"http://127.0.0.1:{port}"
    wait_up(base + "/", proc, "ollapy serve", log)
    return proc, base


def start_llama_server(exe: str, model: str, tmp: Path, threads: int) -> tuple[subprocess.Popen, str]:
    """llama-server as llama.vscode's docs start it (``--cache-reuse 256``), one slot of NUM_CTX, the same
    threads, flash attention off and weight repacking off (as ollapy runs on the CPU)."""
    port = free_port()
    log = tmp / "llama-server.log"
    cmd = [exe, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", str(NUM_CTX),
           "-t", str(threads), "-fa", "off", "--no-repack", "--cache-reuse", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    base = f"http://127.0.0.1:{port}"
    wait_up(base + "/health", proc, "llama-server", log)
    return proc, base


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- report -----------------------------------------------------------------------------------------------
def pct(xs: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


class Rows:
    def __init__(self) -> None:
        self.missed = 0

    def row(self, ok: bool, what: str, value: str, target: str) -> None:
        self.missed += not ok
        print(f"{'ok' if ok else 'MISSED':<7} {what:<58} {value:<44} target {target}", flush=True)


def ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a FIM model's GGUF file")
    ap.add_argument("--native-bin", help="folder with llama-server (default: PATH, then "
                    "~/.cache/ollapy/native/build/bin)")
    ap.add_argument("--file", help="the source file typed into (default: the standard library's cmd.py)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: the standard library's bisect.py, 3 words, "
                    "1 ring-buffer chunk, only the last request of each shape compared cold")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--extra-chunks", type=int, default=None, help="llama.vscode ring-buffer chunks (default 4)")
    ap.add_argument("--continue-layout", choices=("plain", "moved-line"), default=None,
                    help="the fim_layout option on Continue's requests (default: the server's)")
    ap.add_argument("--cold-last", type=int, default=None,
                    help="check only the last N requests of each shape against cold ones (default: every request; "
                         "--quick: 1)")
    ap.add_argument("--json", help="write every measurement to this file")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers

    exe = None
    for d in ([args.native_bin] if args.native_bin else []) + [None, "~/.cache/ollapy/native/build/bin"]:
        cand = shutil.which("llama-server") if d is None else str(Path(d).expanduser() / "llama-server")
        if cand and os.access(cand, os.X_OK):
            exe = cand
            break
        if args.native_bin:
            break
    model = str(Path(args.model).expanduser().resolve())
    file_path = Path(args.file) if args.file else Path(bisect.__file__ if args.quick else cmd.__file__)
    text = file_path.read_text(encoding="utf-8")
    tr = make_trace(text, 3 if args.quick else None)
    n_chunks = args.extra_chunks if args.extra_chunks is not None else (1 if args.quick else 4)
    n_cold = args.cold_last if args.cold_last is not None else (1 if args.quick else len(tr.steps))
    cold_steps = tr.steps[len(tr.steps) - max(1, min(n_cold, len(tr.steps))):]
    chunks = ring_chunks(Path(heapq.__file__).read_text(encoding="utf-8"), n_chunks, Path(heapq.__file__).name)

    tmp = Path(tempfile.mkdtemp(prefix="bench-fim-"))
    done = False
    procs: list[subprocess.Popen] = []
    out: dict = {"model": model, "file": str(file_path), "steps": tr.steps}
    rows = Rows()
    try:
        proc, obase = start_ollapy(tmp, args.threads)
        procs.append(proc)
        ohttp = httpx.Client(base_url=obase, timeout=900, limits=httpx.Limits(max_keepalive_connections=0))
        nproc, nbase, nhttp = None, None, None
        if exe:
            nproc, nbase = start_llama_server(exe, model, tmp, args.threads)
            procs.append(nproc)
            nhttp = httpx.Client(base_url=nbase, timeout=900, limits=httpx.Limits(max_keepalive_connections=0))
        flush_slot(ohttp, model)  # loads the model
        toks = ohttp.post("/tokenize", json={"model": model, "content": text}).json()["tokens"]
        kv_tok = int(ps_model(ohttp).get("kv_bytes_per_token") or 0)
        file_kv = len(toks) * kv_tok
        print(f"model {Path(model).name}; file {file_path} ({len(toks)} tokens, KV {file_kv / 2**20:.1f} MiB at "
              f"{kv_tok} B/token); typed at line {tr.at + 1}: {tr.steps[-1]!r} ({len(tr.steps)} requests); "
              f"{n_chunks} ring-buffer chunks of {Path(heapq.__file__).name}")
        print(f"ollapy {obase}; llama-server {exe or 'not found'}; {args.threads} threads; load average "
              f"{os.getloadavg()[0]:.1f} at start\n")

        # 1. llama.vscode's shape on both servers, request by request in turn
        b0 = cache_bytes(ohttp)
        for http in (ohttp, nhttp) if nhttp else (ohttp,):
            r = http.post("/infill", json=vscode_prep_body(chunks, model))
            if r.status_code != 200:
                raise RuntimeError(f"ring-buffer update: HTTP {r.status_code}: {r.text[:300]}")
        vs_o, vs_n = [], []
        for i, typed in enumerate(tr.steps):
            body = vscode_body(tr, typed, chunks, args.n_predict, model)
            order = [("o", ohttp), ("n", nhttp)] if i % 2 == 0 else [("n", nhttp), ("o", ohttp)]
            for who, http in order:
                if http is None:
                    continue
                res = post_infill(http, body)
                (vs_o if who == "o" else vs_n).append(res)
        b1 = cache_bytes(ohttp)
        # 1b. the same on ollapy with the opt-in moved-line layout (info)
        vs_m = [post_infill(ohttp, {**vscode_body(tr, typed, chunks, args.n_predict, model),
                                    "options": {"fim_layout": "moved-line"}}) for typed in tr.steps]
        b1m = cache_bytes(ohttp)

        # 2. Continue's shape on ollapy
        cont = [post_generate(ohttp, continue_body(tr, typed, args.n_predict, model, args.continue_layout))
                for typed in tr.steps]
        b2 = cache_bytes(ohttp)

        # 3. the same requests cold: nothing reused (another prompt through the slot first, the cache off)
        cold_vs, cold_cont = [], []
        for typed in cold_steps:
            flush_slot(ohttp, model)
            cold_vs.append(post_infill(ohttp, {**vscode_body(tr, typed, chunks, args.n_predict, model),
                                               "cache_prompt": False}))
        for typed in cold_steps:
            flush_slot(ohttp, model)
            cold_cont.append(post_generate(ohttp, continue_body(tr, typed, args.n_predict, model,
                                                                args.continue_layout), cache=False))

        # 5. cancellation: a long completion closed by the client after a few tokens
        # raw: the file's text without a FIM frame, so the model writes code on instead of ending the middle
        long_body = {"model": model, "prompt": "\n".join(tr.prefix_lines()) + "\n", "raw": True,
                     "options": {"temperature": 0, "num_predict": 400, "num_ctx": NUM_CTX}}
        nxt_body = continue_body(tr, tr.steps[-1], args.n_predict, model, args.continue_layout)
        # the next request on an idle slot, for comparison: after the same long prompt answered to its end
        post_generate(ohttp, {**long_body, "options": {**long_body["options"], "num_predict": 12}})
        idle = post_generate(ohttp, nxt_body)
        stamps = []
        poll = httpx.Client(base_url=obase, timeout=60)  # kept alive: a poll is one request, no TCP handshake
        ps_model(poll)
        with httpx.Client(base_url=obase, timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            with c.stream("POST", "/api/generate", json={**long_body, "stream": True}) as r:
                for line in r.iter_lines():
                    if line and json.loads(line).get("response") is not None:
                        stamps.append(time.perf_counter())
                    if len(stamps) >= 12:
                        break
            t_close = time.perf_counter()  # leaving the block closed the connection
        t_free = None
        while time.perf_counter() - t_close < 60:
            if int(ps_model(poll).get("slots_busy", 1)) == 0:
                t_free = time.perf_counter()
                break
            time.sleep(0.001)
        poll.close()
        step = statistics.median(b - a for a, b in zip(stamps[2:], stamps[3:])) if len(stamps) > 4 else float("nan")
        # the next request at the close: a second long completion, closed, then the next request sent at once
        with httpx.Client(base_url=obase, timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            with c.stream("POST", "/api/generate", json={**long_body, "stream": True}) as r:
                for i, _line in enumerate(r.iter_lines()):
                    if i >= 12:
                        break
        nxt = post_generate(ohttp, nxt_body)

        # ---- rows
        print("llama.vscode shape (/infill), per request: TTFT ms, tokens prefilled")
        for i, typed in enumerate(tr.steps):
            n = f"{vs_n[i].ttft * 1000:7.0f} {vs_n[i].prefilled:5d}" if vs_n else "      -     -"
            print(f"  {i + 1:2d} ollapy {vs_o[i].ttft * 1000:7.0f} {vs_o[i].prefilled:5d}   llama-server {n}   "
                  f"moved-line {vs_m[i].ttft * 1000:7.0f} {vs_m[i].prefilled:5d}   {typed.strip()[-24:]!r}")
        print("Continue shape (/api/generate), per request: TTFT ms warm / cold, tokens prefilled warm / cold")
        off = len(tr.steps) - len(cold_steps)  # the cold requests are the last ones
        for i in range(len(tr.steps)):
            c = cold_cont[i - off] if i >= off else None
            print(f"  {i + 1:2d} {cont[i].ttft * 1000:7.0f} / {c.ttft * 1000 if c else float('nan'):7.0f}   "
                  f"{cont[i].prefilled:5d} / {c.prefilled if c else -1:5d}")
        print()

        o50, o95 = pct([r.ttft for r in vs_o], 50), pct([r.ttft for r in vs_o], 95)
        opre = statistics.median(r.prefilled for r in vs_o)
        if vs_n:
            n50, n95 = pct([r.ttft for r in vs_n], 50), pct([r.ttft for r in vs_n], 95)
            npre = statistics.median(r.prefilled for r in vs_n)
            rows.row(o50 <= n50, "llama.vscode /infill TTFT p50, ollapy vs llama-server",
                     f"{ms(o50)} vs {ms(n50)} ({o50 / n50:.2f}x)", "<= 1.0x")
            print(f"{'':<7} {'  TTFT p95':<58} {ms(o95)} vs {ms(n95)}")
            print(f"{'':<7} {'  tokens prefilled per request (median; first request)':<58} "
                  f"{opre:.0f} vs {npre:.0f} ({vs_o[0].prefilled} vs {vs_n[0].prefilled})")
            m50 = pct([r.ttft for r in vs_m], 50)
            print(f"{'info':<7} {'llama.vscode, ollapy fim_layout=moved-line vs llama-server':<58} "
                  f"{ms(m50)} vs {ms(n50)} ({m50 / n50:.2f}x); prefilled "
                  f"{statistics.median(r.prefilled for r in vs_m):.0f} per request")
        else:
            rows.row(False, "llama.vscode /infill TTFT p50, ollapy vs llama-server",
                     f"{ms(o50)} vs - (no llama-server)", "<= 1.0x (build it: scripts/build_native_baselines.sh)")
        w50, c50 = pct([r.ttft for r in cont], 50), pct([r.ttft for r in cold_cont], 50)
        need = 5.0 if args.continue_layout == "moved-line" else 3.0
        rows.row(c50 / w50 >= need, f"Continue /api/generate TTFT p50, warm vs full re-prefill "
                 f"({args.continue_layout or 'server default'} layout)",
                 f"{ms(w50)} vs {ms(c50)} ({c50 / w50:.1f}x faster)", f">= {need:.0f}x")
        print(f"{'':<7} {'  TTFT p95 warm; tokens prefilled warm vs cold (median)':<58} "
              f"{ms(pct([r.ttft for r in cont], 95))}; {statistics.median(r.prefilled for r in cont):.0f} vs "
              f"{statistics.median(r.prefilled for r in cold_cont):.0f}")
        warm = vs_o[off:] + cont[off:]
        same = sum(a.content == b.content for a, b in zip(warm, cold_vs + cold_cont))
        total = len(warm)
        rows.row(same == total, "completions identical to the same request cold (both shapes)",
                 f"{same}/{total}", "all")
        for name, (a, b) in (("llama.vscode", (b0, b1)), ("Continue", (b1m, b2))):
            stored, disk = b[0] - a[0], b[1] - a[1]
            rows.row(stored <= 1.5 * file_kv, f"prompt-cache bytes over the {name} trace ({len(tr.steps)} requests)",
                     f"{stored / 2**20:.1f} MiB = {stored / file_kv:.2f}x file KV (disk {disk / 2**20:.1f} MiB)",
                     "<= 1.5x")
        if t_free is None:
            rows.row(False, "cancelled completion: slot free after the client closed", "not free in 60 s",
                     "<= one decode step")
        else:
            rows.row(t_free - t_close <= step, "cancelled completion: slot free after the client closed",
                     f"{ms(t_free - t_close)} (a decode step {ms(step)})", "<= one decode step")
            print(f"{'':<7} {'  the next request sent at the close: TTFT':<58} {ms(nxt.ttft)} (on an idle slot "
                  f"{ms(idle.ttft)}: waited {ms(max(0.0, nxt.ttft - idle.ttft))})")
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end (2 cores shared with other jobs: timings are "
              f"noisy where it is high)")
        out.update({"vscode_ollapy": [vars(r) for r in vs_o], "vscode_llama_server": [vars(r) for r in vs_n],
                    "continue": [vars(r) for r in cont], "cold_vscode": [vars(r) for r in cold_vs],
                    "cold_continue": [vars(r) for r in cold_cont], "file_tokens": len(toks), "file_kv": file_kv,
                    "cache_bytes": [b0, b1, b1m, b2], "cancel_free_s": None if t_free is None else t_free - t_close,
                    "decode_step_s": step, "vscode_moved_line": [vars(r) for r in vs_m],
                    "next_ttft_s": nxt.ttft, "idle_ttft_s": idle.ttft})
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        done = True
    finally:
        for p in procs:
            stop(p)
        if done:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"the servers' logs: {tmp}", file=sys.stderr)
    print(f"\n{rows.missed} missed" if rows.missed else "\nall targets met")
    return 1 if rows.missed else 0


if __name__ == "__main__":
    sys.exit(main())
