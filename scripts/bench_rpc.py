"""RPC's own cost here: a model local, on one loopback `ollapy rpc-server`, and split over two, in one run.

For each layout a fresh worker process (``--worker``) loads the model with ``rpc`` set to the servers (a
ggml RPC server serves one client connection at a time, and ggml keeps its connection for the life of a
process, so each layout gets its own process), then generates ``--tokens`` greedy tokens ``--repeats``
times from the same prompt with the prompt cache off. Reported per layout:

* load time (``load_duration``: weights sent to the servers included) and the bytes sent while loading;
* decode tokens/s (``eval_count / eval_duration``, median of the repeats) and its ratio to local;
* bytes per generated token that cross the sockets, both directions. Counted in a second pass through a
  byte-counting TCP relay inside the worker (the relay's copying would slow the timed pass, so timing runs
  without it): counters are read at the first streamed chunk and at the last.

Every layout runs with flash attention off (the CPU default here; with offload devices llama.cpp would
choose, and a different attention path changes the last bits of the logits, so greedy texts could part).
The servers run with ``--threads`` CPU threads each; two servers on one host take turns (layers run in
order), so they do not compete for cores. Target rows: each RPC layout's greedy text equals the local one
(``ok``/``MISSED``); the script exits 1 when one is missed. Speed rows have no target here: they show what
RPC costs on loopback, the floor of what it costs across a network.

Usage: ``python scripts/bench_rpc.py [--model GGUF] [--tokens 64] [--repeats 3] [--threads N]``.
The child-runner cost for a local model (no RPC) is ``scripts/bench_runner.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = Path.home() / ".cache/ollapy/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


class Relay:
    """A TCP relay ``127.0.0.1:port`` -> ``target`` that counts the bytes it forwards (both directions)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sent = 0  # client -> server
        self.received = 0  # server -> client
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def total(self) -> int:
        with self.lock:
            return self.sent + self.received

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, "received"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                dst.sendall(data)
                with self.lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def worker(args) -> None:
    """One layout in this process; prints one JSON line."""
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    endpoints = [e for e in args.rpc.split(",") if e]
    relays = []
    if args.relay and endpoints:
        relays = [Relay((e.rsplit(":", 1)[0], int(e.rsplit(":", 1)[1]))) for e in endpoints]
        endpoints = [f"127.0.0.1:{r.port}" for r in relays]
    opts = Options(num_ctx=1024, num_thread=args.threads, rpc=",".join(endpoints), flash_attn="off", temperature=0.0,
                   repeat_penalty=1.0, num_predict=args.tokens, seed=1)
    out: dict = {"rpc": args.rpc, "relay": bool(relays)}
    with LoadedModel(args.model, opts) as model:
        out["load_s"] = model.load_duration_ns / 1e9
        out["load_bytes"] = sum(r.total() for r in relays)
        prompt = model.chat_prompt([{"role": "user", "content": PROMPT}])
        rates, per_token, texts = [], [], []
        for _ in range(1 + args.repeats):  # the first is a warm-up
            req = model.submit(prompt, opts, cache=False)
            parts, at_first, last = [], None, None
            for chunk in req:
                if at_first is None:
                    at_first = sum(r.total() for r in relays)
                parts.append(chunk.text)
                last = chunk
            m = last.metrics
            rates.append(m.eval_count / (m.eval_duration / 1e9))
            if relays and m.eval_count > 1:
                per_token.append((sum(r.total() for r in relays) - at_first) / (m.eval_count - 1))
            texts.append("".join(parts))
        out["decode_tps"] = statistics.median(rates[1:])
        out["bytes_per_token"] = statistics.median(per_token[1:]) if per_token else 0
        out["text"] = texts[-1]
        out["eval_count"] = m.eval_count
    print(json.dumps(out), flush=True)


def run_worker(args, rpc: str, relay: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", str(args.model), "--tokens", str(args.tokens),
           "--repeats", str(args.repeats), "--threads", str(args.threads), "--rpc", rpc]
    if relay:
        cmd.append("--relay")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    if proc.returncode != 0:
        sys.exit(f"worker ({rpc or 'local'}) failed with {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_servers(n: int, threads: int) -> list[tuple[subprocess.Popen, str]]:
    from ollapy.errors import RpcUnavailable
    from ollapy.rpc_endpoint import probe_endpoint

    servers = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "ollapy.cli.main", "rpc-server", "--port", str(port),
                                 "--threads", str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=str(ROOT))
        ep = f"127.0.0.1:{port}"
        for _ in range(600):
            try:
                probe_endpoint(ep)
                break
            except RpcUnavailable:
                if proc.poll() is not None:
                    sys.exit(f"rpc-server on {ep} exited with {proc.returncode}")
                time.sleep(0.1)
        servers.append((proc, ep))
    return servers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--relay", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rpc", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if not args.model.exists():
        sys.exit(f"{args.model}: no such file (run scripts/fetch_test_models.py)")
    servers = start_servers(2, args.threads)
    try:
        eps = [ep for _, ep in servers]
        layouts = [("local", ""), ("1 rpc server", eps[0]), ("2 rpc servers", ",".join(eps))]
        rows = []
        for name, rpc in layouts:
            timed = run_worker(args, rpc, relay=False)
            counted = run_worker(args, rpc, relay=True) if rpc else {"bytes_per_token": 0, "load_bytes": 0}
            rows.append((name, timed, counted))
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()
    local = rows[0][1]
    print(f"model {args.model.name}, {args.tokens} tokens x {args.repeats} (median), {args.threads} threads "
          f"per process, loopback")
    print(f"{'layout':<15} {'load s':>7} {'load MB sent':>13} {'decode tok/s':>13} {'vs local':>9} "
          f"{'bytes/token':>12}  same text as local")
    missed = 0
    for name, timed, counted in rows:
        same = timed["text"] == local["text"] and counted.get("text", local["text"]) == local["text"]
        judge = "-" if name == "local" else ("ok" if same else "MISSED")
        missed += judge == "MISSED"
        print(f"{name:<15} {timed['load_s']:>7.2f} {counted['load_bytes'] / 1e6:>13.1f} "
              f"{timed['decode_tps']:>13.1f} {timed['decode_tps'] / local['decode_tps']:>8.2f}x "
              f"{counted['bytes_per_token']:>12,.0f}  {judge}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
