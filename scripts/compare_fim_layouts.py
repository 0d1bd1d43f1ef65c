#!/usr/bin/env python
"""Compare two fill-in-the-middle prompt layouts on code-completion cases with expected answers (issue 52, item 4).

Continue sends the whole prefix, the line being typed included, as ``prompt`` and the rest as ``suffix``. Two ways
to lay that out with a model's FIM tokens (Qwen2.5-Coder's shown):

* ``plain``:      ``<|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>``
* ``moved-line``: ``<|fim_prefix|>PREFIX-without-its-unfinished-last-line<|fim_suffix|>SUFFIX<|fim_middle|>LINE``
  (llama-server's ``/infill`` layout, which llama.vscode relies on: the text typed on the current line comes after
  the middle token, so each keystroke only extends the prompt's end and everything before it stays a cached
  prefix; with ``plain`` a keystroke changes the prompt before the suffix, so the suffix is prefilled again).
* ``spm``:        ``<|fim_suffix|>SUFFIX<|fim_prefix|>PREFIX<|fim_middle|>`` (llama-server's ``--spm-infill``:
  suffix first, so a keystroke only extends the prompt's end, and the typed text stays where it stands).

``--against`` picks the layout compared with ``plain`` (``moved-line`` by default, or ``spm``).

Each case of ``scripts/fim_cases.py`` runs greedily in both layouts (raw prompts, the special tokens written as
text and read back as tokens, as Ollama's ``raw`` and llama-server's ``/completion`` read them; generation stops
at the first newline), and the first completed line is checked against the case's accepted answers. Prints one
row per case, then: exact first-line matches per layout, identical first lines, cases where the moved line is
better / worse, and the recommendation this data gives.

    python scripts/compare_fim_layouts.py                       # starts `ollapy serve` with the 0.5B coder model
    python scripts/compare_fim_layouts.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    python scripts/compare_fim_layouts.py --native-bin ~/.cache/ollapy/native/build/bin   # through llama-server
    python scripts/compare_fim_layouts.py --url http://127.0.0.1:11435 --model qwen2.5-coder:0.5b  # a running one

Exit status: 0 when every request was answered, 1 otherwise. A benchmark for the record, not part of CI (about
80 requests of 100-350 prompt tokens; a few minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fim_cases import CASES, FimCase  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# Qwen2.5-Coder's FIM tokens (llama_vocab_fim_pre/suf/mid of its GGUF); --fim-tokens names another model's
QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
LAYOUTS = ("plain", "moved-line", "spm")


def build_prompt(case: FimCase, layout: str, fim: tuple[str, str, str] = QWEN_FIM) -> str:
    """The raw prompt text of ``case`` in ``layout`` (one of :data:`LAYOUTS`, see the module docstring)."""
    pre, suf, mid = fim
    if layout == "plain":
        return f"{pre}{case.before}{suf}{case.after}{mid}"
    if layout == "spm":
        return f"{suf}{case.after}{pre}{case.before}{mid}"
    assert layout == "moved-line", layout
    cut = case.before.rfind("\n") + 1  # the start of the unfinished line
    return f"{pre}{case.before[:cut]}{suf}{case.after}{mid}{case.before[cut:]}"


@dataclass
class Answer:
    text: str
    prompt_tokens: int  # tokens the server evaluated (after its cache)
    seconds: float


class Server:
    """A raw-completion client: Ollama's ``/api/generate`` (ollapy, Ollama) or llama-server's ``/completion``."""

    def __init__(self, base: str, model: str, api: str, num_predict: int) -> None:
        self.base, self.model, self.api, self.num_predict = base, model, api, num_predict
        self.http = httpx.Client(base_url=base, timeout=600)

    def complete(self, prompt: str) -> Answer:
        """Greedy completion of ``prompt`` up to the first newline (or ``num_predict`` tokens)."""
        t0 = time.perf_counter()
        if self.api == "ollama":
            r = self.http.post("/api/generate", json={
                "model": self.model, "prompt": prompt, "raw": True, "stream": False,
                "options": {"temperature": 0, "num_predict": self.num_predict, "stop": ["\n"]}})
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            d = r.json()
            return Answer(d["response"], d.get("prompt_eval_count", 0), time.perf_counter() - t0)
        r = self.http.post("/completion", json={
            "prompt": prompt, "n_predict": self.num_predict, "temperature": 0, "top_k": 1, "stop": ["\n"],
            "cache_prompt": True})
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        d = r.json()
        return Answer(d["content"], d.get("timings", {}).get("prompt_n", 0), time.perf_counter() - t0)


def start_server(args, tmp: Path) -> tuple[subprocess.Popen, str, str, str]:
    """Start ``ollapy serve`` (or llama-server with --native-bin) on a free loopback port; (process, base URL,
    model name, api)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "wb")
    if args.native_bin:
        exe = str(Path(args.native_bin).expanduser() / "llama-server")
        cmd = [exe, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", "4096",
               "-t", str(args.threads), "-fa", "off"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        health, api, name = base + "/health", "llama", "model"
    else:
        env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{port}", OLLAPY_NUM_PARALLEL="1",
                   OLLAPY_CONTEXT_LENGTH="4096", OLLAPY_NUM_THREAD=str(args.threads), OLLAPY_KEEP_ALIVE="-1",
                   OLLAPY_MODELS=str(tmp / "models"), OLLAPY_CACHE_DIR=str(tmp / "cache"),
                   XDG_STATE_HOME=str(tmp / "state"))
        env.pop("OLLAPY_DEBUG", None)
        proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve", "--allow-paths"], env=env, cwd=str(ROOT),
                                stdout=subprocess.DEVNULL, stderr=log)
        health, api, name = base + "/", "ollama", args.model
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {tmp / 'server.log'}")
        try:
            if httpx.get(health, timeout=1).status_code == 200:
                return proc, base, name, api
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not start in 180 s")


def show(text: str, width: int = 34) -> str:
    s = json.dumps(text.split("\n", 1)[0], ensure_ascii=False)
    return s if len(s) <= width else s[: width - 1] + "…"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF path (or a model name with --url)")
    ap.add_argument("--url", help="a running server to use instead of starting one")
    ap.add_argument("--api", choices=("ollama", "llama"), default="ollama", help="the --url server's API")
    ap.add_argument("--native-bin", help="folder with llama-server: run the cases through it instead of ollapy")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--num-predict", type=int, default=24,
                    help="token cap per completion (the longest accepted line is under 20 tokens)")
    ap.add_argument("--fim-tokens", default=",".join(QWEN_FIM), help="prefix,suffix,middle token texts")
    ap.add_argument("--against", choices=LAYOUTS[1:], default="moved-line",
                    help="the layout compared with plain (its answers fill the 'moved' columns)")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--json", help="write every answer to this file")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="print the table of earlier runs' --json files (e.g. parts run with --only side by side)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        by_name = {r["case"]: r for part in parts for r in part["rows"]}
        rows = []
        for c in CASES:  # judged again: the rules of fim_cases.py as they are now
            if c.name in by_name:
                r = by_name[c.name]
                rows.append({**r, "plain_ok": c.passes(r["plain"]), "moved_ok": c.passes(r["moved"])})
        args.against = parts[0].get("against", "moved-line")
        print(f"model: {parts[0]['model']}\nmerged from {len(parts)} runs\n")
        print(f"{'case':<24} {'plain':<5} {'moved':<5} {'same':<4}  {'plain first line':<34}  moved-line first line")
        for r in rows:
            print_row(r)
        return summarize(rows, args.against)
    fim = tuple(args.fim_tokens.split(","))
    assert len(fim) == 3, "--fim-tokens takes three comma-separated token texts"
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]

    proc = None
    tmp = Path(tempfile.mkdtemp(prefix="fim-layouts-"))
    try:
        if args.url:
            base, name, api = args.url.rstrip("/"), args.model, args.api
        else:
            proc, base, name, api = start_server(args, tmp)
        server = Server(base, name, api, args.num_predict)
        where = f"llama-server ({args.native_bin})" if args.native_bin else (args.url or "ollapy serve")
        print(f"model: {args.model}\nserver: {where}; greedy, first line, at most {args.num_predict} tokens; "
              f"plain vs {args.against} (the 'moved' columns)\n")
        print(f"{'case':<24} {'plain':<5} {'moved':<5} {'same':<4}  {'plain first line':<34}  moved-line first line")
        rows, failed = [], 0
        for case in cases:
            got = {}
            for layout in ("plain", args.against):
                try:
                    got[layout] = server.complete(build_prompt(case, layout, fim))
                except (httpx.HTTPError, RuntimeError) as e:
                    print(f"{case.name} {layout}: {e}", file=sys.stderr)
                    failed += 1
                    got[layout] = Answer(f"<error: {e}>", 0, 0.0)
            p, m = got["plain"], got[args.against]
            pok, mok = case.passes(p.text), case.passes(m.text)
            same = p.text.split("\n", 1)[0] == m.text.split("\n", 1)[0]
            rows.append({"case": case.name, "language": case.language, "plain": p.text, "moved": m.text,
                         "plain_ok": pok, "moved_ok": mok, "same": same,
                         "plain_prompt_tokens": p.prompt_tokens, "moved_prompt_tokens": m.prompt_tokens})
            print_row(rows[-1])
            if args.json:  # after each case: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps({"model": args.model, "against": args.against, "rows": rows},
                                                      indent=1))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)  # the server's scratch store, cache and log

    if failed:
        print(f"\n{failed} requests failed: no comparison")
        return 1
    return summarize(rows, args.against)


def print_row(r: dict) -> None:
    print(f"{r['case']:<24} {'ok' if r['plain_ok'] else '-':<5} {'ok' if r['moved_ok'] else '-':<5} "
          f"{'=' if r['same'] else '≠':<4}  {show(r['plain']):<34}  {show(r['moved'])}", flush=True)


def summarize(rows: list[dict], other: str = "moved-line") -> int:
    """Print the totals of plain vs ``other`` (the layout in the rows' ``moved`` fields) and the recommendation;
    0."""
    n = len(rows)
    plain_ok = sum(r["plain_ok"] for r in rows)
    moved_ok = sum(r["moved_ok"] for r in rows)
    same = sum(r["same"] for r in rows)
    better = sum(r["moved_ok"] and not r["plain_ok"] for r in rows)
    worse = sum(r["plain_ok"] and not r["moved_ok"] for r in rows)
    space_only = sum(not r["same"] and r["plain"].split("\n", 1)[0].strip() == r["moved"].split("\n", 1)[0].strip()
                     for r in rows)
    print(f"\ncases{'':<35}{n}")
    print(f"{'exact first-line matches, plain':<40}{plain_ok}/{n}")
    print(f"{'exact first-line matches, ' + other:<40}{moved_ok}/{n}")
    print(f"{'identical first lines':<40}{same}/{n} ({space_only} more differ only in white space)")
    by_name = {c.name: c for c in CASES}
    healed = sum(not r["moved_ok"] and by_name[r["case"]].passes(r["moved"].lstrip(" ")) for r in rows)
    print(f"{other + ' right but for a leading space':<40}{healed}")
    print(f"{other + ' better (plain wrong)':<40}{better}")
    print(f"{other + ' worse (plain right)':<40}{worse}")
    if moved_ok >= plain_ok:
        rec = (f"{other}: at least as many right answers as plain, and a keystroke prefills only the typed "
               "text instead of the line and the whole suffix")
    else:
        rec = (f"plain: {plain_ok - moved_ok} more right answers than {other}; its cheaper keystrokes do not "
               "buy back wrong completions")
    print(f"{'recommendation':<40}{rec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
