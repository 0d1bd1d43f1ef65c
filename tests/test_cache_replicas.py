"""Two `ollapy serve` replicas on one host, each with its own model store, sharing one OLLAPY_CACHE_DIR:
a system prompt prefilled on one replica is a prompt-cache disk hit on the other (README: "Sharing the disk cache")."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx
from conftest import live_server, post_chat

from ollapy.cache.fileformat import SUFFIX, TMP_PREFIX, read_header
from ollapy.cache.tiers import LAYOUT

SYSTEM = " ".join(f"Guideline {i}: answer briefly, kindly and truthfully." for i in range(30))
QUESTION = "What is the capital of France?"
LANDED_GUARD_S = 300.0  # only a guard against a hang: the test waits for the file, not for a time


def _add_model(url: str, gguf: Path) -> None:
    """Upload the GGUF as a blob and create ``smol:latest`` in this replica's own store."""
    import ollama

    oc = ollama.Client(host=url)
    oc.create(model="smol:latest", files={"smol.gguf": oc.create_blob(gguf)})


def _chat(url: str, question: str) -> dict:
    return post_chat(url, SYSTEM, question, num_predict=12)


def _cache_figures(url: str) -> dict:
    """The loaded model's prompt-cache counters from /api/ps (this replica's own)."""
    models = httpx.get(url + "/api/ps", timeout=30).json()["models"]
    assert len(models) == 1, models
    return models[0]["prompt_cache"]


def _state_files(cache_dir: Path) -> list[Path]:
    """Complete state files (renamed into place; temporary files excluded)."""
    return sorted(p for p in (cache_dir / LAYOUT).rglob(f"*{SUFFIX}") if not p.name.startswith(TMP_PREFIX))


def _wait_until_written(url: str, cache_dir: Path) -> list[Path]:
    """Wait until every state file the replica at ``url`` queued has landed in ``cache_dir``; returns them.

    The replica counts a file when it queues the write (``files_written``); its writer thread renames the
    file into place later. Polls both until they agree; the guard only stops a hang.
    """
    deadline = time.monotonic() + LANDED_GUARD_S
    while True:
        queued = _cache_figures(url)["files_written"]
        files = _state_files(cache_dir)
        if queued >= 1 and len(files) == queued:
            return files
        assert time.monotonic() < deadline, f"{queued} state file(s) queued, on disk after {LANDED_GUARD_S}s: {files}"
        time.sleep(0.1)


def test_a_system_prompt_prefilled_on_one_replica_is_a_disk_hit_on_another(smollm2_path, tmp_path):
    shared = tmp_path / "shared-cache"
    env = {"OLLAPY_CACHE_DIR": str(shared)}
    with contextlib.ExitStack() as stack:
        url_a = stack.enter_context(live_server(tmp_path / "replica-a", env=env))
        url_b = stack.enter_context(live_server(tmp_path / "replica-b", env=env))
        assert url_a != url_b
        for url in (url_a, url_b):
            _add_model(url, smollm2_path)

        first = _chat(url_a, QUESTION)
        assert first["prompt_cache_tokens"] == 0
        assert first["message"]["content"].strip()
        (landed,) = _wait_until_written(url_a, shared)
        saved = read_header(landed)  # a whole, checksummed file: the system prompt's end
        assert 64 <= len(saved.tokens) < first["prompt_eval_count"]

        second = _chat(url_b, QUESTION)
        # replica B never prefilled the system prompt: it restored replica A's file, then prefilled the question
        assert second["prompt_cache_tokens"] == len(saved.tokens)
        assert second["prompt_eval_count"] == first["prompt_eval_count"]
        assert second["message"]["content"] == first["message"]["content"]
        figures = _cache_figures(url_b)
        assert figures["hits_disk"] == 1 and figures["hits_ram"] == 0 and figures["misses"] == 0, figures
        assert figures["tokens_reused"] == len(saved.tokens)
        # replica A's own counters saw none of it: the hit happened in replica B's process
        assert _cache_figures(url_a)["hits_disk"] == 0
