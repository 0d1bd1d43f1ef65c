"""The prompt cache from one `ollapy run` process to the next, through the real CLI entry point, on the real model.

A shell script runs `ollapy run MODEL --system "$SYS" ...` once per question; every process is new, so the KV
state of the long system prompt must be on disk, complete, when a process exits, and the next one must reuse it.

* a second process reuses the system prompt and answers the same (question on stdin, then as an argument);
* with a deliberately slowed disk writer (fault injection in a ``python -c`` bootstrap, no product hook) exit
  waits for the write, and the next, unpatched process reuses the file;
* two processes at once on one cache directory (idle machine, and with two busy loops holding both CPUs):
  asserted on events only (reused token counts, outputs, temp files, readable entries), never on which one
  finishes first;
* Ctrl-C while exit waits for a slowed write: 130, one "not saved" line, no temporary file left, no traceback.

The test models are tiny but the machine has 2 cores: each cold prefill of the ~1,800-token prompt takes a few
seconds idle, much longer under load. Timeouts here only guard against hangs; nothing asserts on time.
"""
from __future__ import annotations

import hashlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HANG_GUARD_S, ROOT, run_cli

from ollapy.cache.fileformat import SUFFIX, TMP_PREFIX, read_header, read_payload
from ollapy.cache.tiers import LAYOUT

pytestmark = pytest.mark.slow


def _rules(n: int) -> str:
    return " ".join(f"Rule {i}: answer the question politely, in one short sentence, and never invent facts."
                    for i in range(1, n + 1))


SYSTEM = _rules(90)  # about 1,790 tokens
# Ctrl-C test: any state being written at exit will do; a shorter system prompt (two 8 MiB chunks per file) keeps
# its cold prefill short
SHORT_SYSTEM = _rules(20)
QUESTION = "What is the capital of France? Answer in one word."
ANSWER = b"The capital of France is Paris."
MIN_SYSTEM_TOKENS = 1700  # the system prompt alone is longer than this (checked through `prompt eval count`)

# The fault-injection bootstrap: `python -c BOOTSTRAP ARGS...` behaves as `ollapy ARGS...` except that every
# chunk of a prompt-cache file write first sleeps SLOW_WRITER_DELAY seconds (while the temporary file exists),
# and each write and the writer's close are logged, in order, to SLOW_WRITER_LOG. SIGINT gets Python's default
# handler, as in a process started from an interactive shell (a test runner may have started us with it ignored).
BOOTSTRAP = r'''
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
DELAY = float(os.environ["SLOW_WRITER_DELAY"])
LOG = os.environ["SLOW_WRITER_LOG"]

def event(*words):
    with open(LOG, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")

import ollapy.cache.tiers as tiers
import ollapy.cache.writer as writer

real_write_file = tiers.write_file
real_close = writer.CacheWriter.close

def slow_write_file(path, *args, check=None, **kw):
    event("write-start", path.name)
    def slow_check():
        event("chunk", path.name)
        time.sleep(DELAY)
        if check is not None:
            check()
    try:
        size = real_write_file(path, *args, check=slow_check, **kw)
    except BaseException as exc:
        event("write-aborted", path.name, type(exc).__name__)
        raise
    event("write-done", path.name, size)
    return size

def logged_close(self, *args, **kw):
    event("drain-start", self.pending)
    try:
        res = real_close(self, *args, **kw)
    except BaseException as exc:
        event("drain-raised", type(exc).__name__)
        raise
    event("drain-end", res.unsaved)
    return res

tiers.write_file = slow_write_file
writer.CacheWriter.close = logged_close
sys.argv = ["ollapy", *sys.argv[1:]]
from ollapy.cli import main
main()
'''


# ---- helpers ---------------------------------------------------------------------------------------------
def _args(model: Path, *extra: str, system: str = SYSTEM) -> list[str]:
    return ["run", str(model), "--system", system, "--verbose", "-o", "temperature=0", "-o", "repeat_penalty=1",
            "-o", "num_predict=16", *extra]


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop("OLLAPY_DEBUG", None)
    env.update(extra)
    return env


def _stat(stderr: bytes, label: str) -> int:
    m = re.search(rb"^" + re.escape(label.encode()) + rb": +(\d+) token", stderr, re.M)
    assert m, f"no {label!r} line in stderr:\n{stderr.decode(errors='replace')[-1500:]}"
    return int(m.group(1))


def _reused(stderr: bytes) -> int:
    return _stat(stderr, "prompt cache")


def _cache_root() -> Path:
    return Path(os.environ["OLLAPY_CACHE_DIR"])  # set per test by conftest's _isolated_dirs


def _temp_files(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.startswith(".tmp")]


def _state_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / LAYOUT).rglob(f"*{SUFFIX}") if not p.name.startswith(TMP_PREFIX))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def smollm2_sha(smollm2_path) -> str:
    return _sha256(smollm2_path)


def _check_entries(root: Path, model_sha: str) -> dict[str, int]:
    """Every state file under ``root`` passes all checks (header, tokens, payload crc) for this model.

    Returns ``file name -> number of tokens``.
    """
    out = {}
    for p in _state_files(root):
        hdr = read_header(p, model_sha256=model_sha)  # raises CacheFileError on any failed check
        assert len(read_payload(hdr)) == hdr.payload_len
        out[p.name] = len(hdr.tokens)
    return out


def _assert_clean_exit(proc_stderr: bytes) -> None:
    assert b"Traceback" not in proc_stderr, proc_stderr.decode(errors="replace")
    assert b"not saved" not in proc_stderr, proc_stderr.decode(errors="replace")


def _popen(argv: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=str(ROOT), **kw)


def _finish(procs: list[subprocess.Popen], timeout: float = HANG_GUARD_S) -> list[tuple[bytes, bytes]]:
    """communicate() with every process; any still running when this fails is killed (never left behind)."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _events(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()]


def _run_slow(model: Path, log: Path, delay: float, *extra: str, input: str | None = None):
    argv = [sys.executable, "-c", BOOTSTRAP, *_args(model, *extra)]
    return subprocess.run(argv, input=input.encode() if input is not None else None, capture_output=True,
                          env=_env(SLOW_WRITER_DELAY=str(delay), SLOW_WRITER_LOG=str(log)), cwd=str(ROOT),
                          timeout=HANG_GUARD_S)


# ---- 1. the next process reuses the system prompt ----------------------------------------------------------
def test_next_process_reuses_the_system_prompt(smollm2_path, smollm2_sha):
    root = _cache_root()
    first = run_cli(*_args(smollm2_path), input=QUESTION + "\n", timeout=HANG_GUARD_S)
    assert first.returncode == 0, first.stderr.decode()
    _assert_clean_exit(first.stderr)
    assert first.stdout.strip() == ANSWER
    n_prompt = _stat(first.stderr, "prompt eval count")
    assert n_prompt > MIN_SYSTEM_TOKENS + 20  # system prompt plus template and question
    assert _reused(first.stderr) == 0  # a fresh cache directory
    assert _temp_files(root) == []
    saved = _check_entries(root, smollm2_sha)
    assert max(saved.values()) >= MIN_SYSTEM_TOKENS, saved

    second = run_cli(*_args(smollm2_path, QUESTION), timeout=HANG_GUARD_S)  # the question as an argument
    assert second.returncode == 0, second.stderr.decode()
    _assert_clean_exit(second.stderr)
    assert _stat(second.stderr, "prompt eval count") == n_prompt  # stdin and argument build the same prompt
    assert _reused(second.stderr) >= MIN_SYSTEM_TOKENS
    assert second.stdout == first.stdout
    assert _temp_files(root) == []
    _check_entries(root, smollm2_sha)


# ---- 2. exit waits for a slow write --------------------------------------------------------------------
def test_exit_waits_for_a_slowed_cache_write(smollm2_path, smollm2_sha, tmp_path):
    root = _cache_root()
    log = tmp_path / "events.log"
    first = _run_slow(smollm2_path, log, 0.3, input=QUESTION)
    assert first.returncode == 0, first.stderr.decode()
    _assert_clean_exit(first.stderr)
    assert first.stdout.strip() == ANSWER
    assert _reused(first.stderr) == 0

    ev = _events(log)
    started = [e[1] for e in ev if e[0] == "write-start"]
    done = [e[1] for e in ev if e[0] == "write-done"]
    assert started, "the slowed write_file was never called: the fault injection did not take"
    assert sorted(done) == sorted(started)  # every write this process began, it finished
    assert not [e for e in ev if e[0] == "write-aborted"]
    kinds = [e[0] for e in ev]
    assert "drain-start" in kinds and "drain-raised" not in kinds
    i_drain = kinds.index("drain-start")  # the model's close (a later close of the same writer is a no-op)
    assert int(ev[i_drain][1]) >= 1  # work was queued or running when exit began to drain
    assert "write-done" in kinds[i_drain:]  # ... and exit waited for it
    assert [e for e in ev if e[0] == "drain-end"][0] == ["drain-end", "0"]  # nothing unsaved
    assert kinds[-1] == "drain-end"  # nothing was written after the drain returned
    assert _temp_files(root) == []
    saved = _check_entries(root, smollm2_sha)
    assert saved and set(saved) <= set(done)  # what is on disk is what this process wrote (a longer entry may
    # replace the system prompt's), complete
    assert max(saved.values()) >= MIN_SYSTEM_TOKENS

    second = run_cli(*_args(smollm2_path, QUESTION), timeout=HANG_GUARD_S)  # not patched
    assert second.returncode == 0, second.stderr.decode()
    _assert_clean_exit(second.stderr)
    assert _reused(second.stderr) >= MIN_SYSTEM_TOKENS
    assert second.stdout == first.stdout
    assert _temp_files(root) == []


# ---- 3. two processes at once on one cache directory ---------------------------------------------------
def _two_at_once_then_a_third(model: Path, model_sha: str, *extra: str,
                              load: list[subprocess.Popen] | None = None) -> None:
    """Start two `ollapy run` at once; check what they did and left; then a third process must reuse it.

    ``extra`` options go to all three; ``load`` (busy loops) is killed once the pair has finished, before the
    third run.
    """
    root = _cache_root()
    args = _args(model, *extra, QUESTION)
    cmd = [sys.executable, "-m", "ollapy.cli.main", *args]
    try:
        pair = [_popen(cmd, _env()) for _ in range(2)]
        outs = _finish(pair)
    finally:
        for p in load or []:
            p.kill()
            p.wait()
    for p, (out, err) in zip(pair, outs):
        assert p.returncode == 0, err.decode(errors="replace")
        _assert_clean_exit(err)
        assert out.strip() == ANSWER
        reused = _reused(err)
        # Each either computed the prompt (0) or found the other's saved system prompt; never a partial state.
        assert reused == 0 or reused >= MIN_SYSTEM_TOKENS, reused
    assert outs[0][0] == outs[1][0]
    assert _temp_files(root) == []
    saved = _check_entries(root, model_sha)  # concurrent renames onto the same names left whole files only
    assert max(saved.values()) >= MIN_SYSTEM_TOKENS, saved

    third = run_cli(*args, timeout=HANG_GUARD_S)
    assert third.returncode == 0, third.stderr.decode()
    _assert_clean_exit(third.stderr)
    assert _reused(third.stderr) >= MIN_SYSTEM_TOKENS
    assert third.stdout == outs[0][0]
    assert _temp_files(root) == []
    _check_entries(root, model_sha)


def test_two_processes_share_one_cache_dir(smollm2_path, smollm2_sha):
    _two_at_once_then_a_third(smollm2_path, smollm2_sha)


def test_two_processes_share_one_cache_dir_on_a_busy_machine(smollm2_path, smollm2_sha):
    busy = []
    try:
        for _ in range(2):
            busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        # One llama.cpp thread per process: with both cores taken, two threads that meet at llama.cpp's spin
        # barriers make each decode step wait for a descheduled peer, and the test would crawl. What is tested
        # here is the cache: 4 CPU-bound threads on 2 cores starve the idle-priority writer until exit drains it.
        _two_at_once_then_a_third(smollm2_path, smollm2_sha, "-o", "num_thread=1", load=busy)
    finally:
        for p in busy:
            if p.poll() is None:
                p.kill()
            p.wait()


# ---- 4. Ctrl-C while exit waits for the cache ----------------------------------------------------------
def _read_line(proc: subprocess.Popen, deadline: float) -> bytes:
    """One line of ``proc``'s stdout, without blocking past ``deadline``."""
    fd = proc.stdout.fileno()
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"no answer line on stdout (got {buf!r})"
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"stdout closed before an answer line (got {buf!r}); rc={proc.poll()}"
            buf += chunk
    return buf


def test_ctrl_c_while_exit_drains_the_cache(smollm2_path, smollm2_sha, tmp_path):
    root = _cache_root()
    log = tmp_path / "events.log"
    argv = [sys.executable, "-c", BOOTSTRAP, *_args(smollm2_path, QUESTION, system=SHORT_SYSTEM)]
    # its own session: the SIGINT below goes to this process only, and a Ctrl-C at the test runner does not
    proc = _popen(argv, _env(SLOW_WRITER_DELAY="2", SLOW_WRITER_LOG=str(log)), start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        line = _read_line(proc, deadline)
        assert line.strip() == ANSWER
        # Wait for the event, not for time: exit is draining and a write of this process is in progress.
        own_tmp = f"{TMP_PREFIX}{proc.pid}-"
        while True:
            assert proc.poll() is None, "exited before the drain could be interrupted"
            assert time.monotonic() < deadline, "the drain never started with a write in progress"
            kinds = [e[0] for e in _events(log)] if log.exists() else []
            if "drain-start" in kinds and any(os.path.basename(t).startswith(own_tmp) for t in _temp_files(root)):
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert proc.returncode == 130, text
    assert b"Traceback" not in err, text
    assert rest == b""  # the answer was complete before the drain; nothing more on stdout
    warnings = re.findall(r"^.*prompt cache: (\d+) states? not saved.*$", text, re.M)
    assert len(warnings) == 1, text
    assert int(warnings[0]) >= 1
    assert _temp_files(root) == []
    ev = _events(log)
    assert ["drain-raised", "KeyboardInterrupt"] in ev
    assert any(e[0] == "write-aborted" for e in ev)  # the write in progress was stopped, not completed
    _check_entries(root, smollm2_sha)  # whatever was renamed into place before Ctrl-C is whole
