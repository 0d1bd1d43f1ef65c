"""Row (q) of scripts/bench_spec.py: speculative decoding on a real pair (issue 55).

Qwen2.5-Coder-1.5B-Instruct (target) drafted by Qwen2.5-Coder-0.5B-Instruct (same vocabulary), on
:data:`CODE_PROMPTS` (chat requests: "write a Python function ..."), ``num_predict`` tokens each, one plain and
one drafted ``ollapy run`` process per prompt (the order alternating), draft length 4 (ollapy's
``draft_num_predict`` default for a draft model; its policy may verify fewer per step).

- ``q greedy``: ``-o draft=DRAFT.gguf``, temperature 0 and repeat_penalty 1 (bench_spec's GREEDY); the texts
  must be identical; target drafted/plain >= 1.5x (eval rate, over all prompts: plain eval time / drafted eval
  time, the tokens being the same).
- ``q default``: the model's default sampling (the catalogue gives qwen2.5-coder no parameters, so ollapy's
  Ollama defaults: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1) with ``-o seed=1``, the drafted
  side run as a model created from a Modelfile with ``DRAFT`` (so both ways of naming a draft model are
  measured); seeded, so the texts must be identical too; target >= 1.3x.
- ``--q-threads N`` sets ``num_thread`` (and ``-t``/``-td`` of the native tools) on every side: on a machine
  shared with more runnable threads than cores, ggml's spinning thread barrier makes 2-thread timings collapse at
  random, and one thread per process is the steadier comparison.
- ``q vs native`` (with ``--native``): llama.cpp's ``llama-speculative-simple`` on the same pair, prompts
  (rendered by llama-server's ``/apply-template`` with the GGUF's template, as ollapy renders them) and draft
  length (``--spec-draft-n-max 4``), greedy, against plain decoding of the same text by ``llama-server``
  (``/completion``); target: ollapy's greedy speed-up >= 1.0x llama-speculative-simple's (both over their own
  plain decoding, so a machine's load on one side does not decide it).

A row prints ``ok`` or ``MISSED``; bench_spec.py exits 1 on a miss.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_spec as bs  # noqa: E402  (the row's measuring helpers)

TARGET = Path("/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
DRAFT = Path("/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
DRAFT_MAX = 4
CODE_PROMPTS = [
    "Write a Python function is_prime(n) that returns True when n is a prime number. Reply with the code only.",
    "Write a Python function that reverses the order of the words in a sentence, with a docstring and two "
    "doctests. Reply with the code only.",
    "Write a Python class Stack with push, pop, peek and is_empty methods, each with a docstring. Reply with the "
    "code only.",
]
#: the model's default sampling: ollapy's (Ollama's) defaults, none set by the catalogue or the GGUF; seeded
DEFAULT_SAMPLING = ["-o", "seed=1"]
SPEC_LINE = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")


def combined(row: bs.Row) -> tuple[float, list[float]]:
    """(plain eval time / drafted eval time over every prompt, the per-prompt ratios) of a row's runs."""
    per = [got[True].eval_rate / got[False].eval_rate for got in row.runs]
    t_plain = sum(got[False].eval_count / got[False].eval_rate for got in row.runs)
    t_draft = sum(got[True].eval_count / got[True].eval_rate for got in row.runs)
    n_plain = sum(got[False].eval_count for got in row.runs)
    n_draft = sum(got[True].eval_count for got in row.runs)
    return (n_draft / t_draft) / (n_plain / t_plain), per


def pair_rows(env: dict, tmp: Path, num_predict: int, threads: int = 0, target: Path = TARGET,
              draft: Path = DRAFT) -> list[bs.Row]:
    """The (q) rows through ``ollapy run``: greedy with ``-o draft=PATH``, default sampling with a Modelfile DRAFT.
    ``threads``: ``num_thread`` of both sides (0: ollapy's default)."""
    thread_opts = ["-o", f"num_thread={threads}"] if threads else []
    (tmp / "Modelfile.q").write_text(f"FROM {target}\nDRAFT {draft}\n")
    made = subprocess.run([*bs.CLI, "create", "coder-drafted", "-f", str(tmp / "Modelfile.q")], env=env,
                          capture_output=True, text=True, cwd=str(bs.ROOT))
    if made.returncode != 0:
        raise SystemExit(f"ollapy create failed: {made.stderr}")
    rows = []
    for name, goal, sampling, extra, drafted_model in (
            ("q greedy", 1.5, None, ["-o", f"draft={draft}"], None),
            ("q default", 1.3, DEFAULT_SAMPLING + thread_opts, [], "coder-drafted")):
        row = bs.Row(name, goal)
        for i, prompt in enumerate(CODE_PROMPTS):
            sampling_opts = (bs.GREEDY_CLI + thread_opts) if sampling is None else sampling
            bs.paired(row, env, str(target), prompt, num_predict, extra, 1, sampling_opts, drafted_model)
            print(f"  {name} prompt {i + 1}: plain {row.runs[-1][False].eval_rate:.2f} tok/s, drafted "
                  f"{row.runs[-1][True].eval_rate:.2f} tok/s ({row.runs[-1][True].accepted}/"
                  f"{row.runs[-1][True].drafted} accepted), {row.runs[-1][True].eval_count} tokens, same text "
                  f"{row.runs[-1][True].text == row.runs[-1][False].text}", file=sys.stderr, flush=True)
        ratio, per = combined(row)
        row.ratios = [ratio]
        row.note = (f"{len(CODE_PROMPTS)} code prompts x {num_predict} tokens, one run each; per prompt "
                    + ", ".join(f"{r:.2f}x" for r in per))
        rows.append(row)
    return rows


def native_pair(server_exe: str, spec_exe: str, tmp: Path, num_predict: int, ours: bs.Row, threads: int = 0,
                target: Path = TARGET, draft: Path = DRAFT) -> tuple[list[str], bool]:
    """llama-speculative-simple vs llama-server's plain decoding on the (q) prompts, greedy; the lines to print
    and whether ollapy's greedy speed-up (``ours``, the ``q greedy`` row) is at least native's."""
    from ollapy.engine.backend.bindings import choose_extra_bufts

    n_cpu = bs.os.cpu_count() or 2
    threads = str(threads or (n_cpu if n_cpu <= 4 else n_cpu // 2))  # bench_spec's choice for llama-server
    no_repack = [] if choose_extra_bufts("auto")[0] else ["--no-repack"]
    common = ["-c", "4096", "-t", threads, "-fa", "off", *no_repack]
    port = bs.free_port()
    log = open(tmp / "llama-server-q.log", "ab")
    proc = subprocess.Popen([server_exe, "-m", str(target), "--port", str(port), "--host", "127.0.0.1", "-np", "1",
                             *common], stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    plain, spec, texts_same, lines = [], [], [], []
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"llama-server did not start; see {tmp / 'llama-server-q.log'}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        for i, prompt in enumerate(CODE_PROMPTS):
            text = httpx.post(url + "/apply-template", json={"messages": [{"role": "user", "content": prompt}]},
                              timeout=60).json()["prompt"]
            body = httpx.post(url + "/completion", json={"prompt": text, "n_predict": num_predict, "top_k": 1,
                                                         "cache_prompt": False, "seed": 1, **bs.GREEDY},
                              timeout=1800).json()
            t = body["timings"]
            plain.append((t["predicted_n"], t["predicted_n"] / t["predicted_per_second"]))
            p = subprocess.run([spec_exe, "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple",
                                "-p", text, "-n", str(num_predict),
                                "--temp", "0", "--repeat-penalty", "1", "--spec-draft-n-max", str(DRAFT_MAX),
                                "-td", threads, *common], capture_output=True, text=True, timeout=1800)
            m = SPEC_LINE.search(p.stderr) or SPEC_LINE.search(p.stdout)
            if p.returncode or not m:
                raise RuntimeError(f"llama-speculative-simple failed ({p.returncode}): {p.stderr[-1500:]}")
            n, secs = int(m.group(1)), float(m.group(2))
            spec.append((n, secs))
            acc = re.search(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", p.stderr + p.stdout, re.S)
            same = body.get("content", "").strip()[:200] in (p.stdout + p.stderr)
            texts_same.append(same)
            lines.append(f"  native prompt {i + 1}: llama-server plain {t['predicted_per_second']:.2f} tok/s, "
                         f"llama-speculative-simple {n / secs:.2f} tok/s "
                         f"({acc.group(2) + '/' + acc.group(1) + ' accepted' if acc else 'acceptance not printed'})"
                         f", same text as plain {same}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    rate = lambda xs: sum(n for n, _ in xs) / sum(s for _, s in xs)  # noqa: E731
    native_speedup = rate(spec) / rate(plain)
    vs = ours.ratio() / native_speedup
    ok = vs >= 1.0
    lines.append(f"native: llama-server plain {rate(plain):.2f} tok/s, llama-speculative-simple (-md, --spec-type draft-simple, "
                 f"--spec-draft-n-max {DRAFT_MAX}) {rate(spec):.2f} tok/s: speed-up {native_speedup:.2f}x; "
                 f"threads {threads}, -fa off{', --no-repack' if no_repack else ''}")
    lines.append(f"{'q vs native':<12}{vs:>7.2f}x  >= 1.0  {'ok' if ok else 'MISSED':<8}ollapy's greedy speed-up "
                 f"{ours.ratio():.2f}x / llama-speculative-simple's {native_speedup:.2f}x")
    return lines, ok
