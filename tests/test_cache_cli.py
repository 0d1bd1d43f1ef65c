"""The prompt cache across processes, through the real CLI: disk hits in a new process, --no-cache,
and the `cache` commands. (Two `ollapy run` at once on one cache directory: tests/test_cache_process.py.)"""
from __future__ import annotations

import json
import re

from conftest import run_cli

SYSTEM = "You are a concise assistant for a travel agency. " + " ".join(
    f"Rule {i}: answer politely and never invent prices." for i in range(20))
Q = "What is the capital of France? Answer in one word."


def _reused(stderr: bytes) -> int:
    m = re.search(rb"prompt cache: +(\d+) token", stderr)
    assert m, stderr.decode()[-800:]
    return int(m.group(1))


def _args(model, *extra):
    return ("run", str(model), "--verbose", "-o", "temperature=0", "-o", "num_predict=12", "--system", SYSTEM, *extra, Q)


def test_disk_hit_in_new_process_and_no_cache(smollm2_path):
    cold = run_cli(*_args(smollm2_path))
    assert cold.returncode == 0, cold.stderr
    assert _reused(cold.stderr) == 0
    warm = run_cli(*_args(smollm2_path))
    assert warm.returncode == 0, warm.stderr
    assert _reused(warm.stderr) > 200  # the system prompt (and more) came from the disk tier
    assert warm.stdout == cold.stdout
    off = run_cli(*_args(smollm2_path, "--no-cache"))
    assert _reused(off.stderr) == 0 and off.stdout == cold.stdout
    ls = run_cli("cache", "ls")
    assert ls.returncode == 0 and smollm2_path.name.split(".")[0][:6].lower() in ls.stdout.decode().lower()
    header = ls.stdout.decode().splitlines()[0].split()
    assert header[3:6] == ["BLOCKS", "STATE", "FILE"], header
    stats = run_cli("cache", "stats")
    assert stats.returncode == 0 and b"hit" in stats.stdout.lower()
    figures = json.loads(run_cli("cache", "stats", "--json").stdout)
    assert figures["tokens_reused"] == _reused(warm.stderr)  # what the run reported, not the state's length
    bare = run_cli("cache")  # no command: the stats, not a usage error
    assert bare.returncode == 0 and bare.stdout == stats.stdout
