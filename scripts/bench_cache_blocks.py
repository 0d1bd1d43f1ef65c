"""The block-pool rows of scripts/bench_cache.py (issue 36), measured through ``ollapy serve`` and ``/metrics``.

Per model (SmolLM2 and Gemma 3 by default), greedy, ``num_ctx`` 8192, ``num_predict`` 40, each workload on a
fresh server with an empty cache directory:

* **one conversation of 10 turns** (a ~2,600-token system prompt, +~430 tokens a turn): bytes written to the
  disk tier <= 1.25x the final state's bytes (the last prompt's cells plus a state's window, read from the
  largest saved entry: :class:`KvSize`);
* **10 conversations x 3 turns sharing that system prompt**: bytes written <= 1.5x, and bytes held on disk
  (entry and block files after a clean shutdown) and in RAM (``ollapy_prompt_cache_bytes{tier="ram"}``)
  each <= 1.5x the distinct tokens' KV: the system prompt's cells once plus each conversation's own, and, on a
  sliding-window model, the in-window cells of the 11 states the workload must keep to resume (the system
  prompt's end and each conversation's end: llama.cpp keeps a sliding-window layer's cells only in its
  window, so a state carries them whatever its length; ~0 bytes on a model without a window). On a
  sliding-window model the detail also gives, for information, the ratios against every layer's KV of each
  distinct token once (what the model computed; its SWA layers keep only a window of it);

Bytes written are the server's own counters (``bytes_written``) as persisted under its cache directory at shutdown,
so the writes a clean shutdown makes (deferred interim states, :mod:`ollapy.cache.policy`) are counted.
* **next turn evaluates only the new message**: over turns 2-10 of the first workload,
  ``prompt_eval_count - prompt_cache_tokens`` against the new message and its template tokens
  (``prompt_eval_count`` of the turn minus the previous turn's prompt and answer tokens); holds only where
  the finished state keeps the answer (a row-invariant build, ``ollapy info``);
* **6,000-token restore from disk**: a new cache (empty RAM tier) restores a 6,000-token state kept as
  blocks, against the same state kept whole (today's format), in alternating rounds on one backend (median
  of 15); a restore counts from the lookup until the state is verified in llama.cpp and its files are
  unmapped; target <= 1.2x.

``block_rows`` returns ``(case, value, detail, target, verdict)`` tuples for bench_cache.py's table.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WRITE_ONE_MAX = 1.25
WRITE_SHARED_MAX = 1.5
HELD_SHARED_MAX = 1.5
RESTORE_MAX = 1.2
NUM_CTX = 8192
SIZES = (64, 128, 256)  # block sizes the restore row times (the pool uses 256)
NUM_PREDICT = 40
THREADS = int(os.environ.get("BENCH_THREADS", "0"))  # 0: ollapy's default


def system_text() -> str:
    """The shared system prompt (~2,600 tokens on SmolLM2's tokenizer)."""
    return "You are the support assistant of a large library. " + " ".join(
        f"Rule {i}: answer the reader's question politely, in one short sentence, and never invent facts."
        for i in range(135))


def user_text(conv: int, turn: int) -> str:
    """A ~390-token user message, distinct per conversation and turn."""
    facts = " ".join(f"Note {conv}.{turn}.{i}: the reader borrowed volume {conv * 31 + turn * 7 + i} "
                     f"of the {['red', 'blue', 'green', 'grey'][i % 4]} series on day {i + turn}." for i in range(16))
    return f"Conversation {conv}, message {turn}. {facts} Which volume did I borrow last?"


def _metric(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:_total)?\{{(.*)\}} (\S+)$", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


class Server:
    """``ollapy serve`` on a free port with its own cache directory; the model created from ``path``."""

    def __init__(self, tmp: Path, path: Path, tag: str) -> None:
        import httpx
        import ollama

        sys.path.insert(0, str(ROOT / "tests"))
        from rpc_helpers import free_port

        self.cache = tmp / f"cache-{tag}"
        self.log = tmp / f"serve-{tag}.log"
        env = dict(os.environ, OLLAPY_HOST=f"127.0.0.1:{free_port()}", OLLAPY_MODELS=str(tmp / "models"),
                   OLLAPY_CACHE_DIR=str(self.cache), OLLAPY_NUM_PARALLEL="1", OLLAPY_CONTEXT_LENGTH=str(NUM_CTX))
        env.pop("OLLAPY_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "serve"], env=env,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=str(ROOT))
        self.url = f"http://{env['OLLAPY_HOST']}"
        for _ in range(600):
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit("ollapy serve did not start:\n" + self.log.read_text()[-2000:])
            time.sleep(0.2)
        oc = ollama.Client(host=self.url)
        self.model = f"bench-{tag}:latest"
        oc.create(model=self.model, files={path.name: oc.create_blob(path)})

    def chat(self, messages: list[dict]) -> dict:
        import httpx

        body = {"model": self.model, "stream": False, "messages": messages,
                "options": {"temperature": 0, "num_predict": NUM_PREDICT, "num_ctx": NUM_CTX}}
        r = httpx.post(self.url + "/api/chat", json=body, timeout=900)
        if r.status_code != 200:
            raise SystemExit(f"/api/chat: {r.status_code} {r.text}")
        return r.json()

    def metric(self, name: str, **labels) -> float:
        import httpx

        return _metric(httpx.get(self.url + "/metrics", timeout=60).text, name, model=self.model, **labels)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclasses.dataclass(frozen=True)
class KvSize:
    """A model's KV bytes, read from its largest saved entry: ``per_token`` (the whole state over its tokens),
    ``per_cell`` (a cell of the blocks: the full-attention layers) and ``window`` (what a state holds besides its
    tokens' cells: a sliding-window model's in-window cells, about 0 elsewhere)."""

    per_token: float
    per_cell: float
    window: float

    def state(self, tokens: int) -> float:
        """Bytes of one state of ``tokens`` tokens."""
        return tokens * self.per_cell + self.window


def _kv_size(cache: Path) -> KvSize:
    from ollapy.cache.diskcap import iter_state_files
    from ollapy.cache.fileformat import read_header

    best = None
    for p, *_ in iter_state_files(cache):
        h = read_header(p)
        key = (len(h.tokens), h.state_len or h.payload_len)
        if best is None or key > best[0]:
            best = (key, h)
    if best is None:
        return KvSize(0.0, 0.0, 0.0)
    (n, total), h = best
    cells = len(h.blocks) * h.block_tokens
    if not cells:
        return KvSize(total / n, total / n, 0.0)
    per_cell = (total - h.payload_len) / cells
    return KvSize(total / n, per_cell, max(0.0, total - n * per_cell))


def _sliding_window(path: Path) -> int:
    """The model's sliding-window length in tokens (``{arch}.attention.sliding_window``), 0 without one."""
    from gguf import GGUFReader

    for key, field in GGUFReader(str(path)).fields.items():
        if key.endswith(".attention.sliding_window"):
            return int(field.parts[field.data[0]][0])
    return 0


def _written(cache: Path) -> float:
    """Bytes the server process wrote to the disk tier, its shutdown's deferred writes included (the counters it
    persisted under its cache directory)."""
    from ollapy.cache.stats import aggregate

    return float(aggregate(cache, compact=False)["bytes_written"])


def one_conversation(tmp: Path, path: Path, tag: str) -> tuple[list, list[dict]]:
    """Workload 1: one conversation of 10 turns; rows and each turn's reply."""
    from ollapy.cache.diskcap import block_usage

    s = Server(tmp, path, f"{tag}-one")
    msgs = [{"role": "system", "content": system_text()}]
    replies = []
    try:
        for turn in range(10):
            msgs.append({"role": "user", "content": user_text(0, turn)})
            r = s.chat(msgs)
            replies.append(r)
            msgs.append({"role": "assistant", "content": r["message"]["content"]})
        live = s.metric("ollapy_prompt_cache_written_bytes")
    finally:
        s.stop()
    written = _written(s.cache)
    kv = _kv_size(s.cache)
    final = kv.state(replies[-1]["prompt_eval_count"])
    ratio = written / final if final else float("inf")
    u = block_usage(s.cache)
    detail = (f"{written / 1e6:.0f} MB written ({live / 1e6:.0f} MB before shutdown) vs final state "
              f"{final / 1e6:.0f} MB ({replies[0]['prompt_eval_count']} -> {replies[-1]['prompt_eval_count']} "
              f"prompt tokens, {kv.per_cell:.0f} B/cell + {kv.window / 1e6:.1f} MB window); disk: {u['entries']} "
              f"entries, {u['blocks']} blocks, {u['held_bytes'] / 1e6:.0f} MB held, dedupe {u['dedupe_ratio']}x")
    rows = [(f"{tag}: 1 conversation x 10 turns, bytes written", f"{ratio:.2f}x", detail,
             f"<= {WRITE_ONE_MAX}x final state", ratio <= WRITE_ONE_MAX)]
    extra = []
    for prev, cur in zip(replies, replies[1:]):
        evaluated = cur["prompt_eval_count"] - cur.get("prompt_cache_tokens", 0)
        new = cur["prompt_eval_count"] - (prev["prompt_eval_count"] + prev["eval_count"])
        extra.append(evaluated - new)
    rows.append((f"{tag}: next turn evaluates only the new message", f"+{max(extra)} tokens",
                 f"prompt_eval_count - reused - (new message + template), turns 2-10: {extra}",
                 "== 0 (row-invariant build)", max(extra) <= 0))
    return rows, replies


def shared_system(tmp: Path, path: Path, tag: str, sys_tokens: int) -> list:
    """Workload 2: 10 conversations x 3 turns (interleaved by turn) sharing the system prompt."""
    from ollapy.cache.tiers import disk_usage

    s = Server(tmp, path, f"{tag}-shared")
    convs = [[{"role": "system", "content": system_text()}] for _ in range(10)]
    last: list[dict] = [{}] * 10
    try:
        for turn in range(3):
            for i, msgs in enumerate(convs):
                msgs.append({"role": "user", "content": user_text(i + 1, turn)})
                r = s.chat(msgs)
                last[i] = r
                msgs.append({"role": "assistant", "content": r["message"]["content"]})
        ram = s.metric("ollapy_prompt_cache_bytes", tier="ram")
        ram_blocks = s.metric("ollapy_prompt_cache_block_bytes")
        superseded = s.metric("ollapy_prompt_cache_superseded")
    finally:
        s.stop()
    written = _written(s.cache)
    disk = disk_usage(s.cache)["disk_bytes"]
    kv = _kv_size(s.cache)
    distinct_tokens = sys_tokens + sum(r["prompt_eval_count"] + r["eval_count"] - sys_tokens for r in last)
    # each distinct token's cells once, plus the window of each state a workload must keep to resume: the
    # system prompt's and each conversation's end (11 windows; ~0 bytes on a model without a sliding window)
    ends = 1 + len(last)
    distinct = distinct_tokens * kv.per_cell + ends * kv.window
    w, d, m = written / distinct, disk / distinct, ram / distinct
    detail = (f"distinct KV {distinct / 1e6:.0f} MB ({distinct_tokens} tokens x {kv.per_cell:.0f} B/cell"
              + (f" + {ends} windows x {kv.window / 1e6:.1f} MB" if kv.window > 1e5 else "")
              + f"; system prompt {sys_tokens}); written {written / 1e6:.0f} MB, disk {disk / 1e6:.0f} MB, "
              f"RAM {ram / 1e6:.0f} MB ({ram_blocks / 1e6:.0f} MB of blocks, {(ram - ram_blocks) / 1e6:.0f} MB of tails"
              + (f": ~{(ram - ram_blocks) / kv.window:.0f} states' windows, of which {superseded:.0f} are save points a "
                 f"longer one superseded, kept in RAM as checkpoints" if kv.window > 1e5 else "")
              + f"); the old measure (tokens x {kv.per_token:.0f} B/token of the largest state) "
              f"{distinct_tokens * kv.per_token / 1e6:.0f} MB")
    n_swa = _sliding_window(path) if kv.window > 1e5 else 0
    if n_swa:  # information only: every layer's KV of each distinct token once (the window's cells per token)
        every = distinct_tokens * (kv.per_cell + kv.window / n_swa)
        detail += (f"; for comparison, each distinct token's KV in every layer once (window {n_swa} tokens): "
                   f"{every / 1e6:.0f} MB, against which written/disk/RAM are {written / every:.2f}x / "
                   f"{disk / every:.2f}x / {ram / every:.2f}x")
    return [(f"{tag}: 10 conversations x 3 turns, bytes written", f"{w:.2f}x", detail,
             f"<= {WRITE_SHARED_MAX}x distinct KV", w <= WRITE_SHARED_MAX),
            (f"{tag}: 10 conversations x 3 turns, held on disk", f"{d:.2f}x", "",
             f"<= {HELD_SHARED_MAX}x distinct KV", d <= HELD_SHARED_MAX),
            (f"{tag}: 10 conversations x 3 turns, held in RAM", f"{m:.2f}x", "",
             f"<= {HELD_SHARED_MAX}x distinct KV", m <= HELD_SHARED_MAX)]


def system_tokens(path: Path) -> int:
    """Tokens of the system prompt as the chat template renders it (BOS + system turn)."""
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    with LoadedModel(path, Options(num_ctx=NUM_CTX, num_parallel=1), name="t") as m:
        return m.chat_prompt([{"role": "system", "content": system_text()}, {"role": "user", "content": ""}]).keep


def restore_row(tmp: Path, path: Path, tag: str, facts: dict, pairs: int = 15) -> list:
    """Row 4: a 6,000-token state restored from disk by a new cache: blocks joined vs the whole state.

    A restore is timed from the lookup to the verified state in llama.cpp, plus dropping the hit (its files
    unmapped), so each kind pays for its own mappings and not for the kind restored before it.

    Also puts the system prompt's token count (as the chat template renders it) in ``facts["sys_tokens"]``.
    """
    from ollapy.cache import PromptCache
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options
    from ollapy.runner.loader import PathRef

    opts = Options(num_ctx=NUM_CTX, temperature=0, num_predict=1, num_parallel=1, num_thread=THREADS)
    ref = PathRef(name=tag, path=path)
    kinds = {"whole": 0, **{f"B={bt}": bt for bt in SIZES}}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    released: dict[str, list[float]] = {k: [] for k in kinds}  # dropping the hit: its files unmapped
    with LoadedModel(path, opts, name=tag) as m:
        facts["sys_tokens"] = m.chat_prompt([{"role": "system", "content": system_text()},
                                             {"role": "user", "content": ""}]).keep
        prompt = m.chat_prompt([{"role": "system", "content": system_text() + " " + system_text()},
                                {"role": "user", "content": user_text(0, 0)}])
        prompt = dataclasses.replace(prompt, tokens=prompt.tokens[:6000], save_points=())
        for _ in m.submit(prompt, opts, cache=False):
            pass
        b = m.backend
        n_tok = b.seq_pos_max(0) + 1
        toks = list(prompt.tokens[:n_tok])
        state = bytes(b.state_get(0))
        caches = {}
        for kind, bt in kinds.items():
            c = PromptCache(ref, opts, root=tmp / f"restore-{tag}-{kind}", block_tokens=bt)
            with c.bind(m) as bc:
                bc.store(toks, lambda: bytearray(state), persist=True)
                bc.flush()
                caches[kind] = (c, len(next(iter(bc.entries.values())).blocks))
        probe = toks + [toks[-1]]
        for _ in range(pairs):
            for kind in kinds:
                c, _ = caches[kind]
                with c.bind(m) as bc:  # a new cache: empty RAM tier, the files from disk
                    bc.refresh()
                    t = time.perf_counter()
                    hit = bc.load(bc.peek(probe), defer_check=True)
                    ok = b.state_set(0, hit.load()) and hit.verified()
                    t1 = time.perf_counter()
                    assert ok and hit.tier == "disk", kind
                    hit = None  # unmaps this kind's files inside its own time: no kind pays for another's
                    t2 = time.perf_counter()
                    times[kind].append(t2 - t)
                    released[kind].append(t2 - t1)
        b.seq_clear(0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["B=256"] / med["whole"]
    sizes = ", ".join(f"{k} {med[k] * 1000:.1f} ms ({caches[k][1]} blocks)" for k in kinds if k != "whole")
    return [(f"{tag}: {n_tok}-token restore from disk, blocks vs whole state", f"{ratio:.2f}x",
             f"whole {med['whole'] * 1000:.1f} ms; {sizes}; {len(state) / 1e6:.0f} MB, median of {pairs}; "
             f"of which unmapping: whole {statistics.median(released['whole']) * 1000:.1f} ms, "
             f"B=256 {statistics.median(released['B=256']) * 1000:.1f} ms; blocks "
             + ("read where they lie (llama_state_seq_set_data_segments)" if b.restores_segments else "joined first"),
             f"<= {RESTORE_MAX}x", ratio <= RESTORE_MAX)]


def block_rows(tmp: Path, models: list[tuple[str, Path]], restore_only: bool = False, skip_restore: bool = False) -> list:
    """Every block-pool row for each ``(tag, gguf path)``."""
    out = []
    for tag, path in models:
        facts: dict = {}
        if skip_restore:
            facts["sys_tokens"] = system_tokens(path)
        else:
            out += restore_row(tmp, path, tag, facts)
        if restore_only:
            continue
        rows, _ = one_conversation(tmp, path, tag)
        out += rows
        out += shared_system(tmp, path, tag, facts["sys_tokens"])
    return out


def main() -> int:
    """Standalone: ``python scripts/bench_cache_blocks.py [--models both|smollm2|gemma] [--restore-only]``."""
    import argparse
    import shutil
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", choices=["both", "smollm2", "gemma"], default="both")
    ap.add_argument("--restore-only", action="store_true")
    ap.add_argument("--skip-restore", action="store_true")
    args = ap.parse_args()
    home = Path.home() / ".cache/ollapy/test-models"
    models = [("smollm2", home / "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma", home / "gemma-3-270m-q4_k_m.gguf")]
    models = [m for m in models if args.models in ("both", m[0])]
    tmp = Path(tempfile.mkdtemp(prefix="bench-blocks-"))
    try:
        rows = block_rows(tmp, models, args.restore_only, args.skip_restore)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w = max(len(r[0]) for r in rows)
    for case, value, detail, target, verdict in rows:
        print(f"{case:<{w}}  {value:>10}  {target:<28} {'ok' if verdict else 'MISSED'}")
        if detail:
            print(f"{'':<{w}}    {detail}")
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
