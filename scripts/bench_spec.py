#!/usr/bin/env python3
"""Speculative decoding benchmark (issue 22): drafted vs plain decode speed through the CLI users run.

Every row runs ``ollapy run MODEL --verbose --no-cache -o temperature=0 -o num_predict=N PROMPT`` twice per
round, once plain and once with drafting (``-o draft=ngram`` or ``-o draft=DRAFT.gguf``), in alternating
order, and takes the median over rounds of the paired ratio of ``eval rate`` (tokens/s of decoding). Greedy
(argmax: temperature 0 and ``repeat_penalty`` 1, llama-server's default, so that the native anchor runs the same
text) output must be token-identical, so each row also compares the two texts. It prints the draft line of
``--verbose`` ("draft: N proposed, M accepted (rate)") when the engine prints one.

| row | task | target |
|---|---|---|
| a  | Gemma 3 continues a 20-line log whose lines share one template (160 tokens) | n-gram >= 1.6x, same text |
| a2 | SmolLM2: "repeat this paragraph exactly" | >= 1.2x |
|    | SmolLM2: a code edit that renames one variable (it rewrites the code instead: acceptance reported) | >= 0.97x |
| b  | SmolLM2: RAG extraction quoting a passage from a ~1,500-token context | >= 1.2x |
| c  | SmolLM2: a free-form story (drafting must not cost when it does not help) | >= 0.97x |
| d  | 4 concurrent streams of (a) through ``ollapy serve`` (num_parallel 4), aggregate tokens/s | >= 1.0x |
| dm | draft model on (a): Gemma's first layers cut by scripts/make_draft_gguf.py | >= 1.3x |
| q  | Qwen2.5-Coder-1.5B drafted by 0.5B, code prompts (bench_spec_pair.py): greedy / default sampling | >= 1.5x / 1.3x |

``--native`` adds the vendored llama.cpp's ``llama-server`` (scripts/build_native_baselines.sh builds it; this
llama.cpp's server drafts with ``--spec-type ngram-simple`` and with ``-md DRAFT``): plain and drafted on (a)
and (c), measured in the same run, and the target "ollapy with n-gram drafting >= 1.1x llama-server with
n-gram drafting on (a)"; with row q, llama.cpp's ``llama-speculative-simple`` on the real pair against
llama-server's plain decoding, target "ollapy's greedy speed-up >= 1.0x llama-speculative-simple's" (row q is
not in the default ``--rows``: ``--rows q [--native]``). Each row prints ok or MISSED; the exit status is 1 when
any row missed.

Run it on a quiet machine: ``flock /tmp/ollapy-cpu.lock python scripts/bench_spec.py [--native] [--rounds 5]``.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "ollapy.cli.main"]
DRAFT_LINE = re.compile(r"draft:\s+(\d+) proposed, (\d+) accepted")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


# ---- prompts --------------------------------------------------------------------------------------------
def log_prompt(lines: int = 20, seed: int = 22) -> str:
    """(a): a log whose lines share one template; Gemma 3 (base) continues it at temperature 0."""
    rng = random.Random(seed)
    return "".join(f"Line {i}: the keeper logged wind speed {rng.randint(3, 40)} knots and wave height "
                   f"{rng.randint(1, 9)}.{rng.randint(0, 9)} metres at the north light.\n" for i in range(1, lines + 1))


PARAGRAPH = ("The lighthouse at Skerry Point was built in 1851 from granite quarried on the island itself. Its lamp "
             "burned colza oil until 1904, when a paraffin vapour burner replaced it, and the light was automated in "
             "1988. The last keeper, Margaret Innes, kept a daily log of the weather for thirty-one years.")
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''


def rag_prompt(target_tokens: int = 1500) -> str:
    """(b): a ~1,500-token context of short passages and a question whose answer quotes one of them."""
    rng = random.Random(7)
    towns = ["Arden", "Bellmouth", "Carrow", "Dunmore", "Eskdale", "Fenwick", "Glenarm", "Harlow", "Inver", "Kelso"]
    passages = []
    for i in range(60):
        town = towns[i % len(towns)]
        passages.append(f"[{i + 1}] The harbour of {town} handled {rng.randint(100, 900)} ships in {1900 + i}; its "
                        f"pier was extended by {rng.randint(5, 60)} metres and the tide gauge read "
                        f"{rng.randint(2, 7)}.{rng.randint(0, 9)} metres at spring tide.")
    context = "\n".join(passages)  # about 25 tokens per passage
    return (f"Context:\n{context}\n\nQuestion: Quote passage [42] exactly, word for word, then say which town it "
            f"is about.")


TASKS = {
    "a": ("gemma-raw", log_prompt(), 160),
    "a2-repeat": ("smol", f"Repeat this paragraph exactly, word for word:\n\n{PARAGRAPH}", 120),
    "a2-rename": ("smol", f"Rename the variable subtotal to net_total in this code. Reply with the whole code only."
                          f"\n\n{CODE}", 120),
    "b": ("smol", rag_prompt(), 120),
    "c": ("smol", "Write a short story about a lighthouse keeper who finds a message in a bottle.", 200),
}


# ---- measuring ollapy -----------------------------------------------------------------------------------
@dataclass
class Run:
    text: str
    eval_rate: float
    eval_count: int
    drafted: int | None = None
    accepted: int | None = None


@dataclass
class Row:
    name: str
    target: float
    ratios: list[float] = field(default_factory=list)
    same_text: bool = True
    drafted: int = 0
    accepted: int = 0
    draft_line: bool = False
    note: str = ""
    runs: list[dict] = field(default_factory=list)

    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0

    def ok(self) -> bool:
        return bool(self.ratios) and self.ratio() >= self.target and self.same_text and self.draft_line

    def line(self) -> str:
        acc = (f"{self.accepted}/{self.drafted} accepted ({self.accepted / self.drafted:.0%})" if self.drafted else
               "0 drafted" if self.draft_line else "no draft line in --verbose")
        why = "" if self.same_text else "; TEXT DIFFERS"
        spread = f"; rounds {min(self.ratios):.2f}-{max(self.ratios):.2f}" if len(self.ratios) > 1 else ""
        return (f"{self.name:<12}{self.ratio():>7.2f}x  >= {self.target:<5}{'ok' if self.ok() else 'MISSED':<8}"
                f"{acc}{why}{spread}{'; ' + self.note if self.note else ''}")


def parse_verbose(stderr: str) -> tuple[float, int, int | None, int | None]:
    rate = re.search(r"^eval rate:\s+([\d.]+) tokens/s", stderr, re.M)
    count = re.search(r"^eval count:\s+(\d+)", stderr, re.M)
    draft = DRAFT_LINE.search(stderr)
    if not rate or not count:
        raise RuntimeError(f"no eval rate in --verbose output:\n{stderr[-2000:]}")
    return float(rate.group(1)), int(count.group(1)), *(map(int, draft.groups()) if draft else (None, None))


#: greedy decoding = the argmax at every step: temperature 0 and no repeat penalty. Ollama's default
#: repeat_penalty (1.1) would make another text than llama-server's greedy one (its default is 1.0), so the
#: native anchor would run another task; the penalty also breaks the very repetition drafting feeds on.
GREEDY = {"temperature": 0, "repeat_penalty": 1.0}
GREEDY_CLI = [a for k, v in GREEDY.items() for a in ("-o", f"{k}={v}")]


def run_cli(env: dict, model: str, prompt: str, num_predict: int, extra: list[str],
            sampling: list[str] | None = None) -> Run:
    """One ``ollapy run --verbose --no-cache`` process; ``sampling``: its sampling options (default greedy)."""
    cmd = [*CLI, "run", model, "--verbose", "--no-cache", *(GREEDY_CLI if sampling is None else sampling),
           "-o", f"num_predict={num_predict}", *extra, prompt]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, cwd=str(ROOT))
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    rate, count, drafted, accepted = parse_verbose(p.stderr)
    return Run(p.stdout, rate, count, drafted, accepted)


def paired(row: Row, env: dict, model: str, prompt: str, num_predict: int, draft_opts: list[str], rounds: int,
           sampling: list[str] | None = None, drafted_model: str | None = None) -> Row:
    """``rounds`` pairs of plain and drafted runs, the order alternating per round; ratio = drafted/plain.
    ``drafted_model``: run the drafted side as this model (a Modelfile with ``DRAFT``) instead of ``model``."""
    for r in range(rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        got = {d: run_cli(env, (drafted_model or model) if d else model, prompt, num_predict,
                          draft_opts if d else [], sampling) for d in order}
        row.runs.append(got)
        row.ratios.append(got[True].eval_rate / got[False].eval_rate)
        row.same_text &= got[True].text == got[False].text
        if got[True].drafted is not None:
            row.draft_line = True
            row.drafted += got[True].drafted
            row.accepted += got[True].accepted or 0
    return row


# ---- (d): concurrent streams through ollapy serve -------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _streams(url: str, model: str, prompt: str, num_predict: int, n: int, options: dict) -> tuple[float, list]:
    import httpx

    body = {"model": model, "prompt": prompt, "raw": True, "stream": False,
            "options": {**GREEDY, "num_predict": num_predict, **options}}
    async with httpx.AsyncClient(timeout=900) as client:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post(url + "/api/generate", json=body) for _ in range(n)))
        wall = time.perf_counter() - t0
    for r in replies:
        r.raise_for_status()
    data = [r.json() for r in replies]
    return sum(d["eval_count"] for d in data) / wall, data


def concurrent_row(env: dict, gguf: Path, rounds: int, n: int = 4) -> Row:
    import httpx

    row = Row("d (4x a)", 1.0)
    port = free_port()
    senv = dict(env, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL=str(n))
    proc = subprocess.Popen([*CLI, "serve", "--allow-paths"], env=senv, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("ollapy serve did not start") from None
                time.sleep(0.2)
        _, prompt, num_predict = TASKS["a"]
        asyncio.run(_streams(url, str(gguf), prompt, 8, n, {}))  # load the model once
        for r in range(rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            got = {d: asyncio.run(_streams(url, str(gguf), prompt, num_predict, n, {"draft": "ngram"} if d else {}))
                   for d in order}
            row.ratios.append(got[True][0] / got[False][0])
            row.same_text &= [d["response"] for d in got[True][1]] == [d["response"] for d in got[False][1]]
        counts = draft_counters(httpx.get(url + "/metrics", timeout=10).text)
        if counts is not None:
            row.draft_line = True
            row.drafted, row.accepted = counts
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if not row.draft_line:
        row.note = "no drafted/draft_accepted token counters in /metrics"
    return row


def draft_counters(metrics: str) -> tuple[int, int] | None:
    """(drafted, accepted) tokens over all models from ``ollapy_tokens_total{kind="drafted"|"draft_accepted"}``
    in the server's /metrics, or None when the server does not count them."""
    got: dict[str, float] = {}
    for m in re.finditer(r'^ollapy_tokens_total\{([^}]*)\}\s+([\d.e+]+)$', metrics, re.M):
        kind = re.search(r'kind="([^"]+)"', m.group(1))
        if kind and kind.group(1) in ("drafted", "draft_accepted"):
            got[kind.group(1)] = got.get(kind.group(1), 0.0) + float(m.group(2))
    if "drafted" not in got:
        return None
    return int(got["drafted"]), int(got.get("draft_accepted", 0))


# ---- native llama-server --------------------------------------------------------------------------------
def native_rows(exe: str, gguf: dict[str, Path], draft_gguf: Path | None, rounds: int, tmp: Path,
                ours_a: Callable[[], float]) -> tuple[list[str], dict[tuple[str, str], float], list[float], list[str]]:
    """llama-server plain vs ``--spec-type ngram-simple`` (and ``-md``) on (a) and (c), /completion timings.

    ``ours_a`` (ollapy's n-gram eval rate on (a), one CLI run) runs once per round beside llama-server's n-gram
    run on (a), the order alternating, so the "vs native" ratios compare runs made at the same time (a shared
    VM's speed drifts over minutes). Returns the lines, the median rates, those per-round ratios, and
    llama-server's first n-gram text on (a) (to check that both ran the same task)."""
    import httpx

    sys.path.insert(0, str(ROOT))
    from ollapy.engine.backend.bindings import choose_extra_bufts

    threads = str(max(1, (os.cpu_count() or 2) // (1 if (os.cpu_count() or 2) <= 4 else 2)))

    def serve(model: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
        port = free_port()
        cmd = [exe, "-m", str(model), "--port", str(port), "--host", "127.0.0.1", "-np", "1", "-c", "4096",
               "-t", threads, "-fa", "off", *extra]
        if not choose_extra_bufts("auto")[0]:
            cmd.append("--no-repack")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "llama-server.log", "ab"))
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}; see {tmp / 'llama-server.log'}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        proc.kill()
        raise RuntimeError("llama-server did not start")

    def complete(url: str, prompt: str, n: int, chat: bool) -> dict:
        """One greedy request: (a) is a raw continuation (/completion); SmolLM2's tasks are chat requests, as
        ollapy runs them (/v1/chat/completions applies the model's template; raw, SmolLM2 answers nothing)."""
        common = {**GREEDY, "top_k": 1, "cache_prompt": False, "seed": 1}
        prompt = prompt.strip()  # what `ollapy run` sends (it strips its prompt argument, as Ollama's CLI does)
        if chat:
            r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}],
                                                                "max_tokens": n, **common}, timeout=900)
        else:
            r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": n, **common}, timeout=900)
        r.raise_for_status()
        body = r.json()
        if "timings" not in body:
            raise RuntimeError(f"llama-server's answer has no timings: {sorted(body)}")
        return body

    # ngram-simple with llama.cpp's defaults (look up the last 12 tokens, draft up to 48); the draft model with
    # Ollama's draft_num_predict default of 4
    modes = {"plain": [], "ngram": ["--spec-type", "ngram-simple"]}
    if draft_gguf is not None:
        modes["draft"] = ["-md", str(draft_gguf), "--spec-draft-n-max", "4"]
    out: dict[tuple[str, str], list[float]] = {}
    drafts: dict[tuple[str, str], tuple[int, int]] = {}
    ours: list[float] = []
    paired_vs: list[float] = []
    native_text: list[str] = []
    for task in ("a", "c"):
        model_key, prompt, n = TASKS[task]
        for mode, extra in modes.items():
            if mode == "draft" and task != "a":
                continue
            proc, url = serve(gguf[model_key], extra)
            try:
                chat = model_key != "gemma-raw"
                complete(url, prompt, 8, chat)
                timings = []
                for r in range(rounds):
                    pair = task == "a" and mode == "ngram"
                    if pair and r % 2:
                        ours.append(ours_a())
                    body = complete(url, prompt, n, chat)
                    timings.append(body["timings"])
                    if pair:
                        native_text.append(body.get("content", ""))
                    if pair and not r % 2:
                        ours.append(ours_a())
                    if pair:
                        paired_vs.append(ours[-1] / timings[-1]["predicted_per_second"])
                out[(task, mode)] = [t["predicted_per_second"] for t in timings]
                drafts[(task, mode)] = (sum(t.get("draft_n", 0) for t in timings),
                                        sum(t.get("draft_n_accepted", 0) for t in timings))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    lines = []
    for (task, mode), rates in out.items():
        drafted, accepted = drafts[(task, mode)]
        acc = f", {accepted}/{drafted} draft tokens accepted" if drafted else ""
        plain = statistics.median(out[(task, "plain")])
        vs = f"{statistics.median(rates) / plain:.2f}x native plain" if plain > 0 else "native plain generated nothing"
        lines.append(f"native {task} {mode:<6} {statistics.median(rates):8.1f} tok/s ({vs}{acc})")
    return lines, {k: statistics.median(v) for k, v in out.items()}, paired_vs, native_text[:1]


# ---- main -----------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="paired, interleaved rounds per row (default 5)")
    ap.add_argument("--rows", default="a,a2,b,c,d,dm", help="rows to run (default all: a,a2,b,c,d,dm)")
    ap.add_argument("--draft-layers", type=int, default=16,
                    help="first blocks of Gemma kept in the draft model (default 16 of 18)")
    ap.add_argument("--draft-vocab", type=int, default=32768,
                    help="tokens kept in the draft model's vocabulary (FR-Spec; default 32768; 0: all 262,144)")
    ap.add_argument("--native", action="store_true", help="also measure llama-server (from PATH or --llama-server)")
    ap.add_argument("--llama-server", help="llama-server executable (default: from PATH)")
    ap.add_argument("--speculative-simple", help="llama-speculative-simple executable for row q's native "
                                                 "anchor (default: from PATH)")
    ap.add_argument("--q-predict", type=int, default=128, help="tokens per code prompt in row q (default 128)")
    ap.add_argument("--q-threads", type=int, default=0, help="num_thread of every side of row q (0: default)")
    args = ap.parse_args()
    fetch = _script("fetch_test_models")
    paths = {m.name: fetch.fetch_model(m, fetch.default_dir()) for m in fetch.MODELS}
    tmp = Path(tempfile.mkdtemp(prefix="bench-spec-"))
    env = dict(os.environ, OLLAPY_MODELS=str(tmp / "models"), OLLAPY_CACHE_DIR=str(tmp / "cache"),
               XDG_STATE_HOME=str(tmp / "state"), OLLAPY_HOST="127.0.0.1:9")
    env.pop("OLLAPY_DEBUG", None)
    # Gemma 3 base has no chat template: a raw-prompt model, so (a) is a plain continuation
    (tmp / "Modelfile").write_text(f'FROM {paths["gemma3"]}\nTEMPLATE "{{{{ .Prompt }}}}"\n')
    made = subprocess.run([*CLI, "create", "gemma-raw", "-f", str(tmp / "Modelfile")], env=env, capture_output=True,
                          text=True, cwd=str(ROOT))
    if made.returncode != 0:
        raise SystemExit(f"ollapy create failed: {made.stderr}")
    models = {"gemma-raw": "gemma-raw", "smol": str(paths["smollm2"])}
    wanted = set(args.rows.split(","))
    rows: list[Row] = []
    draft_gguf = native_draft = None
    if "dm" in wanted:
        draft_gguf = _script("make_draft_gguf").make_draft_gguf(paths["gemma3"], tmp / "gemma-draft.gguf",
                                                               args.draft_layers, vocab=args.draft_vocab or None)
    if args.native:  # llama-server's -md needs the whole vocabulary (a trimmed one fails its compatibility check)
        native_draft = _script("make_draft_gguf").make_draft_gguf(paths["gemma3"], tmp / "gemma-draft-native.gguf",
                                                                 args.draft_layers)
    ngram = ["-o", "draft=ngram"]
    if "a" in wanted:
        model, prompt, n = TASKS["a"]
        rows.append(paired(Row("a", 1.6), env, models[model], prompt, n, ngram, args.rounds))
    if "a2" in wanted:
        model, prompt, n = TASKS["a2-repeat"]
        rows.append(paired(Row("a2-repeat", 1.2), env, models[model], prompt, n, ngram, args.rounds))
        # the issue: "SmolLM2 paraphrases rather than copies: report the acceptance it gets"; it rewrites the
        # function instead of renaming, so there is little to copy and the rule of (c) applies: no cost
        model, prompt, n = TASKS["a2-rename"]
        rows.append(paired(Row("a2-rename", 0.97, note="SmolLM2 rewrites the code: acceptance reported, no cost"),
                           env, models[model], prompt, n, ngram, args.rounds))
    if "b" in wanted:
        model, prompt, n = TASKS["b"]
        rows.append(paired(Row("b", 1.2), env, models[model], prompt, n, ngram, args.rounds))
    if "c" in wanted:
        model, prompt, n = TASKS["c"]
        rows.append(paired(Row("c", 0.97), env, models[model], prompt, n, ngram, args.rounds))
    if "d" in wanted:
        rows.append(concurrent_row(env, paths["gemma3"], args.rounds))
    if "dm" in wanted:
        model, prompt, n = TASKS["a"]
        rows.append(paired(Row("dm (a)", 1.3), env, models[model], prompt, n, ["-o", f"draft={draft_gguf}"],
                           args.rounds))
    q_rows = _script("bench_spec_pair").pair_rows(env, tmp, args.q_predict, args.q_threads) if "q" in wanted else []
    load = os.getloadavg()
    print(f"load average (1/5/15 min) {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs"
          + (": other processes competed for the CPU, timings are noisy" if load[0] > (os.cpu_count() or 1) else ""))
    if rows:
        print(f"ollapy, greedy, median of {args.rounds} paired interleaved runs (drafted / plain eval rate):")
    for row in rows:
        print(row.line())
    if q_rows:
        print("ollapy, Qwen2.5-Coder-1.5B drafted by 0.5B (drafted / plain eval rate, one run per prompt):")
    for row in q_rows:
        print(row.line())
    missed = [r.name for r in rows + q_rows if not r.ok()]
    if q_rows and args.native:
        server = args.llama_server or shutil.which("llama-server")
        spec = args.speculative_simple or shutil.which("llama-speculative-simple")
        if not server or not spec:
            print("native: llama-server or llama-speculative-simple not found (scripts/build_native_baselines.sh)")
            missed.append("q vs native")
        else:
            lines, ok = _script("bench_spec_pair").native_pair(server, spec, tmp, args.q_predict, q_rows[0],
                                                                  args.q_threads)
            print("\n".join(lines))
            if not ok:
                missed.append("q vs native")
    if args.native and wanted & {"a", "c"}:
        exe = args.llama_server or shutil.which("llama-server")
        if not exe:
            print("native: llama-server not found (scripts/build_native_baselines.sh builds it; put it on PATH)")
            missed.append("native")
        else:
            ours_rates: list[float] = []
            ours_text: list[str] = []

            def ours_a() -> float:
                got = run_cli(env, models["gemma-raw"], TASKS["a"][1], TASKS["a"][2], ngram)
                if got.drafted is None:
                    raise RuntimeError("ollapy printed no draft line on (a) with -o draft=ngram")
                ours_rates.append(got.eval_rate)
                ours_text.append(got.text)
                return got.eval_rate

            lines, native, ratios, their_text = native_rows(exe, {"gemma-raw": paths["gemma3"], "smol": paths["smollm2"]},
                                                native_draft, args.rounds, tmp, ours_a)
            print("\n".join(lines))
            vs = statistics.median(ratios)
            verdict = "ok" if vs >= 1.1 else "MISSED"
            same = bool(their_text) and ours_text[0].strip() == their_text[0].strip()
            print(f"(a) text: ollapy's greedy continuation {'is' if same else 'is NOT'} llama-server's")
            print(f"{'a vs native':<12}{vs:>7.2f}x  >= 1.1  {verdict:<8}median of {len(ratios)} interleaved pairs "
                  f"(rounds {min(ratios):.2f}-{max(ratios):.2f}): ollapy n-gram {statistics.median(ours_rates):.1f} "
                  f"tok/s vs llama-server ngram-simple {native[('a', 'ngram')]:.1f} tok/s")
            if verdict != "ok":
                missed.append("a vs native")
    shutil.rmtree(tmp, ignore_errors=True)
    if missed:
        print(f"MISSED: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
