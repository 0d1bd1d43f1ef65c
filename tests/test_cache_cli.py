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


def test_warm_pins_the_system_prompt_once_and_prune_says_what_it_cannot_free(smollm2_path, tmp_path):
    sys_file = tmp_path / "system.txt"
    sys_file.write_text(SYSTEM * 3)
    warm = run_cli("cache", "warm", str(smollm2_path), "--file", str(sys_file))
    assert warm.returncode == 0, warm.stderr
    pinned_tokens = int(re.search(rb"pinned (\d+) tokens", warm.stderr).group(1))
    entries = json.loads(run_cli("cache", "ls", "--json").stdout)
    # one entry: the system prompt up to where conversations part (not the empty user turn the prompt was built with)
    assert [(e["n_tokens"], e["pinned"]) for e in entries] == [(pinned_tokens, True)], entries
    alone = json.loads(run_cli("cache", "stats", "--json").stdout)
    assert alone["block_files"] >= 1 and alone["pinned_bytes"] == alone["disk_bytes"]  # its blocks count as pinned
    run = run_cli("run", str(smollm2_path), "--verbose", "-o", "temperature=0", "-o", "num_predict=4",
                  "--system", SYSTEM * 3, Q)
    assert run.returncode == 0, run.stderr
    assert pinned_tokens - 64 < _reused(run.stderr) <= pinned_tokens
    prune = run_cli("cache", "prune", "--max-bytes", "1")
    assert prune.returncode == 0, prune.stderr
    assert b"still above" in prune.stderr and b"unpin" in prune.stderr, prune.stderr
    assert json.loads(run_cli("cache", "stats", "--json").stdout)["pinned_files"] == 1
    none = run_cli("cache", "ls", "no-such-model")
    assert none.returncode == 0 and b"no prompt-cache entries for 'no-such-model'" in none.stderr


def test_pull_of_a_file_path_says_how_to_use_a_local_file(smollm2_path):
    r = run_cli("pull", str(smollm2_path))
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "is a file path, not a model name" in err and f"ollapy run {smollm2_path}" in err, err
    named = run_cli("pull", "hf.co/no-such-org/no-such-repo:model-Q4_K_M.gguf")  # a file in a repo: a name
    assert named.returncode != 0 and b"is a file path" not in named.stderr, named.stderr
