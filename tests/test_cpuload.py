"""The decode thread budget: fewer llama.cpp threads while other processes keep the CPUs busy."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ollapy.engine.cpuload import SMALL_BATCH, ThreadBudget, read_others_runnable


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _budget(samples, configured=4, n_cpu=4, adaptive=True):
    clock = _Clock()
    it = iter(samples)
    return ThreadBudget(configured, adaptive, interval=1.0, n_cpu=n_cpu, read_others=lambda: next(it), clock=clock), clock


@pytest.mark.parametrize(("others", "want"), [(0, 4), (1, 3), (2, 2), (3, 1), (4, 1), (9, 1)])
def test_wanted_is_the_cpus_left_over_at_least_one(others, want):
    b, _ = _budget([], configured=4, n_cpu=4)
    assert b.wanted(others) == want


def test_wanted_never_exceeds_the_configured_count():
    b, _ = _budget([], configured=2, n_cpu=16)
    assert [b.wanted(n) for n in (0, 10, 14, 15, 20)] == [2, 2, 2, 1, 1]


def test_a_change_needs_two_agreeing_samples_and_waits_for_the_interval():
    b, clock = _budget([3, 3, 0, 3, 0, 0])
    assert b.threads() == 4  # first sample says 1: a candidate only
    assert b.threads() == 4  # same interval: not sampled again
    clock.t = 1.0
    assert b.threads() == 1 and b.changes == [(1.0, 1, 3)]  # second agreeing sample
    clock.t = 2.0
    assert b.threads() == 1  # one quiet sample
    clock.t = 3.0
    assert b.threads() == 1  # busy again: the quiet candidate is dropped
    clock.t = 4.0
    assert b.threads() == 1
    clock.t = 5.0
    assert b.threads() == 4 and b.changes[-1] == (5.0, 4, 0)


def test_the_first_count_comes_from_one_sample_at_start():
    b, clock = _budget([3, 3])
    assert b.prime() == 1 and b.changes == [(0.0, 1, 3)]  # a short CLI request starts on the right count
    assert b.threads() == 1  # within the interval: no new sample
    quiet, _ = _budget([0])
    assert quiet.prime() == 4 and quiet.changes == []


def test_large_batches_keep_every_configured_thread_under_load():
    b, clock = _budget([3] * 10)
    b.threads()
    clock.t = 1.0
    assert b.threads(1) == 1 and b.threads(SMALL_BATCH) == 1  # decode steps and short tails: lowered
    assert b.threads(SMALL_BATCH + 1) == 4 and b.threads(512) == 4  # prefill chunks: every thread


def test_explicit_thread_count_and_unreadable_proc_keep_the_configured_count():
    b, clock = _budget([5, 5, 5], adaptive=False)
    for t in range(3):
        clock.t = float(t)
        assert b.threads() == 4
    b2, clock2 = _budget([None, None])
    clock2.t = 1.0
    assert b2.threads() == 4 and b2.threads() == 4 and b2.changes == []


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="Linux /proc only")
def test_busy_loops_of_other_processes_are_counted_and_own_threads_are_not():
    n = os.cpu_count() or 2
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        seen = []
        for _ in range(50):  # each sample is instantaneous: the loops are runnable in (nearly) every one
            seen.append(read_others_runnable())
            time.sleep(0.02)
        assert max(seen) >= n
    finally:
        for p in loops:
            p.kill()
            p.wait()


def test_engine_switches_threads_before_the_decode_that_uses_them():
    """Fake backend: the engine asks the budget before each decode and calls set_threads only on a change."""
    from fake_backend import FakeBackend

    from ollapy.engine.engine import Engine
    from ollapy.options import Options

    b = FakeBackend(n_parallel=1)
    b.threads = 2
    e = Engine(b)
    try:
        clock = _Clock()
        samples = iter([5] * 1000)
        e.thread_budget = ThreadBudget(2, True, interval=0.0, n_cpu=2, read_others=lambda: next(samples), clock=clock)
        e.submit(list(range(1, 40)), Options(temperature=0, num_predict=3)).result()
    finally:
        e.close()
    names = [c[0] for c in b.calls]
    i = names.index("set_threads")
    assert b.calls[i] == ("set_threads", 1) and names.count("set_threads") == 1
    assert "decode" in names[i:] and names[:i].count("decode") == 1  # one decode on 2 threads, then on 1


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="Linux /proc only")
def test_real_model_decodes_on_fewer_threads_under_load_with_the_same_output(smollm2_path):
    from ollapy.engine.model import LoadedModel
    from ollapy.options import Options

    opts = Options(num_ctx=512, temperature=0, num_predict=12, repeat_penalty=1)
    with LoadedModel(smollm2_path, opts) as m:
        if m.backend.threads < 2:
            pytest.skip("one decode thread configured: nothing to lower")
        quiet, _ = m.chat([{"role": "user", "content": "Name three colours."}], opts, cache=False).result()
        m.engine.thread_budget.interval = 0.0  # sample before every decode
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        try:
            busy, _ = m.chat([{"role": "user", "content": "Name three colours."}], opts, cache=False).result()
        finally:
            for p in loops:
                p.kill()
                p.wait()
        changes = m.engine.thread_budget.changes
        assert any(n == 1 for _, n, _ in changes)  # all CPUs taken: one decode thread (whatever the load before)
        assert busy == quiet  # the thread count never changes what is generated
