"""The decode thread budget: fewer llama.cpp threads while other processes keep the CPUs busy."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ollapy.engine.cpuload import (
    SMALL_BATCH,
    CpuLoad,
    ThreadBudget,
    cgroup_cpu_quota,
    default_threads,
    read_cpu_ticks,
    usable_cpus,
)


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


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")
def test_busy_loops_of_other_processes_on_our_cpus_are_counted():
    cpus = frozenset(os.sched_getaffinity(0))
    load = CpuLoad(cpus)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(cpus))]
    try:
        time.sleep(0.5)  # the loops are running
        load()  # first window
        time.sleep(1.0)
        seen = load()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    # every allowed CPU was taken by a loop of another process (this one slept): other helpers' load only adds
    assert seen == len(cpus)


def test_the_lowered_count_never_exceeds_the_cgroup_limit():
    b = ThreadBudget(8, True, interval=1.0, n_cpu=16, limit=3, read_others=lambda: 0, clock=_Clock())
    assert [b.wanted(n) for n in (0, 13, 14, 15, 40)] == [3, 3, 2, 1, 1]


# ---- fake /proc and cgroup files -------------------------------------------------------------------------
def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc_stat(root, busy: dict[int, int], idle: dict[int, int], own: int):
    """/proc/stat with cpuN lines (user = busy ticks, idle) and /proc/self/stat with utime = own ticks."""
    lines = ["cpu  9999 0 9999 9999 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy[n]} 0 0 {idle[n]} 0 0 0 0 0 0" for n in sorted(busy)]
    _write(root, "stat", "\n".join(lines) + "\nintr 1 2 3\nprocs_running 9\n")
    fields = ["S"] + ["0"] * 10 + [str(own), "0"] + ["0"] * 30  # state, then utime (14) and stime (15)
    _write(root, "self/stat", "1234 (python (odd) name) " + " ".join(fields) + "\n")


def test_cpu_ticks_read_only_the_allowed_cpus_lines(tmp_path):
    _proc_stat(tmp_path, busy={0: 10, 1: 20, 2: 400, 3: 800}, idle={0: 90, 1: 80, 2: 0, 3: 0}, own=0)
    assert read_cpu_ticks(frozenset({0, 1}), tmp_path) == (30, 200)
    assert read_cpu_ticks(frozenset({2, 3}), tmp_path) == (1200, 1200)


def test_load_is_other_processes_work_on_the_allowed_cpus_only(tmp_path):
    """CPUs 0-1 are ours; 2-3 (another container's) are saturated and never count; our own ticks are
    subtracted."""
    t = {"now": 0.0}
    load = CpuLoad(frozenset({0, 1}), tmp_path, clock=lambda: t["now"], sleep=lambda s: t.update(now=t["now"] + s))
    _proc_stat(tmp_path, busy={0: 0, 1: 0, 2: 0, 3: 0}, idle={0: 0, 1: 0, 2: 0, 3: 0}, own=0)

    def step(busy0, busy1, idle0, idle1, own):
        _proc_stat(tmp_path, busy={0: busy0, 1: busy1, 2: 10**6, 3: 10**6}, idle={0: idle0, 1: idle1, 2: 0, 3: 0},
                   own=own)
        t["now"] += 1.0
        return load()

    assert load() is None  # the first call takes two samples: no tick elapsed between them (fake files)
    assert step(100, 0, 0, 100, own=0) == 1  # CPU 0 fully busy with someone else's work
    assert step(200, 100, 0, 100, own=200) == 0  # both busy, all of it ours
    assert step(300, 200, 0, 100, own=300) == 1  # both busy, half of it ours
    assert step(350, 250, 50, 150, own=300) == 1  # half of each: one CPU's worth of others
    t["now"] += 0.01
    assert load() is None  # too short a window: no answer, the reference sample is kept


def test_cgroup_v2_quota_of_the_process_and_its_ancestors(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/user.slice/app.scope\n")
    assert cgroup_cpu_quota(proc, cg) is None  # no cpu.max files
    _write(cg, "user.slice/app.scope/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(proc, cg) is None
    _write(cg, "user.slice/cpu.max", "250000 100000\n")  # the parent limits to 2.5 CPUs
    assert cgroup_cpu_quota(proc, cg) == 2.5
    _write(cg, "user.slice/app.scope/cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(proc, cg) == 1.5
    n = len(os.sched_getaffinity(0))
    assert usable_cpus(proc, cg) == min(n, 2)  # 1.5 CPUs: two threads can use them
    _write(cg, "user.slice/app.scope/cpu.max", "50000 100000\n")
    assert usable_cpus(proc, cg) == 1 and default_threads(proc, cg) == 1


def test_cgroup_v2_inside_a_container_reads_the_namespace_root(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "0::/\n")
    _write(cg, "cpu.max", "100000 100000\n")
    assert cgroup_cpu_quota(proc, cg) == 1.0


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    _write(proc, "self/cgroup", "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n")
    _write(cg, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    _write(cg, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(proc, cg) is None  # -1: no limit
    _write(cg, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n")
    assert cgroup_cpu_quota(proc, cg) == 3.0


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


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")
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


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")
def test_a_draft_model_decodes_on_the_same_thread_budget_as_the_target(smollm2_path):
    """The draft model's context lowers its threads with the target's (a 2-thread ggml barrier on a CPU that other
    processes keep busy made each drafting step take seconds); what is generated stays the same."""
    from ollapy.engine.model import LoadedModel
    from ollapy.engine.spec.policy import StepCost
    from ollapy.options import Options

    copy = "Repeat this paragraph exactly: The lighthouse at Skerry Point was built in 1851 from granite."
    opts = Options(num_ctx=512, temperature=0, num_predict=24, repeat_penalty=1, draft=str(smollm2_path))
    with LoadedModel(smollm2_path, opts, draft_path=smollm2_path) as m:
        dm = m.engine.spec.draft_model
        if m.backend.threads < 2 or dm.backend.threads < 2:
            pytest.skip("one decode thread configured: nothing to lower")
        m.engine.spec.pin_cost(StepCost(1.0, 0.05))  # extra rows nearly free: it drafts whatever the load
        quiet, _ = m.chat([{"role": "user", "content": copy}], opts, cache=False).result()
        m.engine.thread_budget.interval = 0.0
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        try:
            before = dm.stats.decodes
            busy, _ = m.chat([{"role": "user", "content": copy}], opts, cache=False).result()
            drafting_decodes = dm.stats.decodes - before
            threads_under_load = dm.backend.threads
        finally:
            for p in loops:
                p.kill()
                p.wait()
        assert any(n == 1 for _, n, _ in m.engine.thread_budget.changes)
        assert drafting_decodes > 0 and threads_under_load == 1
        assert busy == quiet
