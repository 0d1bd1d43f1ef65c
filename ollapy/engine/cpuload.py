"""How many llama.cpp threads to decode with now: fewer while other processes keep the CPUs busy.

ggml's CPU backend splits every graph node over its threads and makes them
meet at a spin barrier after each node (``ggml_barrier`` in ggml-cpu.c). When
other processes take cores, the scheduler deschedules one of those threads and
the others spin until it runs again, at every node: with every core busy, a
short request's time to first token grows by an order of magnitude
(``scripts/bench_cache.py --busy 2`` measures it; docs/benchmarks.md). llama.cpp
leaves this to the user (``-t``); a runner that users start next to their
other work should not.

The stall is paid per graph node, whatever the batch size, while the work per
node grows with it: a large prefill chunk still gains from every thread.
So only small batches (decode steps and short prompt tails, at most
:data:`SMALL_BATCH` tokens) use the lowered count; larger ones keep the
configured count.

Rule (:class:`ThreadBudget`): ``n = min(configured, limit, max(1, n_cpu - others))`` where ``n_cpu`` is
the CPUs this process may run on (``sched_getaffinity``), ``limit`` those CPUs capped by the cgroup's CPU quota
(cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, rounded up: a container given 1.5 CPUs
runs 2 threads at most), and ``others`` the CPUs' worth of work that other processes did ON THOSE CPUS over the
last sample window (:class:`CpuLoad`: busy time of the allowed CPUs' ``cpuN`` lines of ``/proc/stat``, minus
this process's own CPU time from ``/proc/self/stat``, divided by the window). Busy CPUs outside the process's
cpuset or container never lower its count. The first count comes from one short window when the engine starts
(:meth:`ThreadBudget.prime`: a one-shot CLI request on a loaded machine is short and must not run on the wrong
count); after that it is sampled at most every ``interval`` seconds and a new count is applied only when two
samples in a row agree, so one short spike does not flip it. Only when ``num_thread`` is left to ollapy (0); an
explicit ``num_thread`` is always used as it is. Where ``/proc`` is missing (macOS, Windows) the configured
count is kept.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
SMALL_BATCH = 64  # tokens: batches up to this size decode on the lowered thread count under load
PRIME_WINDOW_S = 0.1  # the first load sample's window (at engine start)
MIN_WINDOW_S = 0.05  # a shorter window is too coarse for /proc/stat's clock ticks: keep sampling


def allowed_cpus() -> frozenset[int]:
    """The CPU numbers this process may run on (its affinity mask); all CPUs where the platform cannot tell."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def _cgroup_paths(proc: Path) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 ``cpu`` controller path, from ``/proc/self/cgroup``."""
    v2 = v1 = None
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and each parent directory up to ``root`` (a quota on any of them applies)."""
    out, cur = [], root / rel.lstrip("/")
    while True:
        out.append(cur)
        if cur == root or root not in cur.parents:
            break
        cur = cur.parent
    return out


def cgroup_cpu_quota(proc: Path = PROC, cgroup: Path = CGROUP) -> float | None:
    """CPUs' worth of time this process's cgroup may use (quota / period), the smallest along its ancestors;
    None when no quota is set or the files cannot be read.

    cgroup v2: ``cpu.max`` holds ``"QUOTA PERIOD"`` (``"max PERIOD"``: no limit). v1: ``cpu.cfs_quota_us``
    (-1: no limit) and ``cpu.cfs_period_us`` under the ``cpu`` (or ``cpu,cpuacct``) hierarchy. Inside a container
    the process's path may be ``/`` (its own namespace): the mount's root files are read then.
    """
    v2, v1 = _cgroup_paths(proc)
    quotas: list[float] = []
    if v2 is not None:
        for d in _ancestors(cgroup, v2):
            try:
                quota, period = (d / "cpu.max").read_text().split()[:2]
            except (OSError, ValueError):
                continue
            if quota != "max" and float(period) > 0:
                quotas.append(float(quota) / float(period))
    if v1 is not None:
        for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            for d in _ancestors(cgroup / mount, v1):
                try:
                    quota = float((d / "cpu.cfs_quota_us").read_text())
                    period = float((d / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
    return min(quotas) if quotas else None


def usable_cpus(proc: Path = PROC, cgroup: Path = CGROUP) -> int:
    """CPUs this process can keep busy: its affinity mask, capped by its cgroup's CPU quota rounded up; >= 1."""
    n = len(allowed_cpus())
    quota = cgroup_cpu_quota(proc, cgroup)
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def default_threads(proc: Path = PROC, cgroup: Path = CGROUP) -> int:
    """llama.cpp's thread count when ``num_thread`` is 0: every usable CPU up to 4, half of them above (the
    other half are hyper-threads or serve the rest of the machine), at least 1."""
    n = usable_cpus(proc, cgroup)
    return n if n <= 4 else max(1, n // 2)


def read_cpu_ticks(cpus: frozenset[int], proc: Path = PROC) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of the ``cpuN`` lines of ``/proc/stat`` for N in ``cpus``; None when
    ``/proc/stat`` cannot be read. Busy is user + nice + system + irq + softirq + steal (another guest's
    time on a shared host counts as taken); total adds idle and iowait."""
    try:
        text = (proc / "stat").read_text()
    except OSError:
        return None
    busy = total = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            n = int(name[3:])
            v = [int(x) for x in fields[:8]] + [0] * (8 - len(fields[:8]))
        except ValueError:
            continue
        if n not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = v
        b = user + nice + system + irq + softirq + steal
        busy += b
        total += b + idle + iowait
    return busy, total


def read_own_ticks(proc: Path = PROC) -> int | None:
    """This process's CPU time (utime + stime of ``/proc/self/stat``) in clock ticks; None when unreadable."""
    try:
        stat = (proc / "self" / "stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


class CpuLoad:
    """Other processes' load on this process's own CPUs, in CPUs' worth of work (a reader for
    :class:`ThreadBudget`).

    Each call compares ``/proc/stat`` (the allowed CPUs' lines only) and this
    process's CPU time with the previous sample: ``others = round((busy - own) /
    (total / len(cpus)))``. A call less than :data:`MIN_WINDOW_S` after the
    previous sample returns None and keeps it (clock ticks are 10 ms). The first
    call takes two samples :data:`PRIME_WINDOW_S` apart. ``proc`` and ``cpus``
    are parameters so tests can pass fake files.
    """

    def __init__(self, cpus: frozenset[int] | None = None, proc: Path = PROC,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.cpus = frozenset(cpus) if cpus is not None else allowed_cpus()
        self.proc = proc
        self._clock = clock
        self._sleep = sleep
        self._last: tuple[float, int, int, int] | None = None

    def _sample(self) -> tuple[float, int, int, int] | None:
        ticks, own = read_cpu_ticks(self.cpus, self.proc), read_own_ticks(self.proc)
        if ticks is None or own is None:
            return None
        return self._clock(), ticks[0], ticks[1], own

    def __call__(self) -> int | None:
        if self._last is None:
            self._last = self._sample()
            if self._last is None:
                return None
            self._sleep(PRIME_WINDOW_S)
        now = self._sample()
        if now is None:
            return None
        last = self._last
        if now[0] - last[0] < MIN_WINDOW_S or now[2] <= last[2]:
            return None
        self._last = now
        per_cpu = (now[2] - last[2]) / max(1, len(self.cpus))
        foreign = (now[1] - last[1]) - (now[3] - last[3])
        return max(0, round(foreign / per_cpu))


class ThreadBudget:
    """The decode thread count for an engine whose configured count is ``configured``.

    ``adaptive`` False (an explicit ``num_thread``) always answers
    ``configured``. ``n_cpu`` (default: the affinity mask's size) and ``limit``
    (default: :func:`usable_cpus`, the mask capped by the cgroup quota) bound the
    lowered count; ``read_others`` (default: a :class:`CpuLoad`) gives the other
    processes' load on those CPUs. :meth:`threads` is called by the engine loop before each
    decode; it costs a few small ``/proc`` reads at most once per ``interval``
    seconds. ``current`` is the lowered count for small batches; ``changes``
    records every change of it as ``(monotonic seconds, threads,
    others_runnable)`` (read by tests and the debug log).
    """

    def __init__(self, configured: int, adaptive: bool = True, *, interval: float = 0.25,
                 n_cpu: int | None = None, limit: int | None = None,
                 read_others: Callable[[], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.configured = max(1, configured)
        self.adaptive = adaptive and self.configured > 1
        self.interval = interval
        self.n_cpu = n_cpu or len(allowed_cpus())
        self.limit = limit or (self.n_cpu if n_cpu else usable_cpus())
        self._read_others = read_others if read_others is not None else (CpuLoad() if self.adaptive else lambda: None)
        self._clock = clock
        self._next = 0.0
        self._candidate: int | None = None
        self.current = self.configured
        self.changes: list[tuple[float, int, int]] = []

    def prime(self) -> int:
        """Set the lowered count from one sample now (no second sample needed for the first decision)."""
        if self.adaptive:
            others = self._read_others()
            if others is not None and self.wanted(others) != self.current:
                self.current = self.wanted(others)
                self.changes.append((self._clock(), self.current, others))
            self._next = self._clock() + self.interval
        return self.current

    def wanted(self, others: int) -> int:
        """Threads when other processes keep ``others`` of this process's CPUs busy:
        ``min(configured, limit, max(1, n_cpu - others))``."""
        return min(self.configured, self.limit, max(1, self.n_cpu - others))

    def threads(self, n_tokens: int = 1) -> int:
        """The count to decode a batch of ``n_tokens`` with now (the lowered count, which changes only after
        two agreeing samples, applies to batches of at most :data:`SMALL_BATCH` tokens)."""
        if not self.adaptive:
            return self.configured
        self._sample()
        return self.current if n_tokens <= SMALL_BATCH else self.configured

    def _sample(self) -> None:
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval
        others = self._read_others()
        if others is None:
            return
        want = self.wanted(others)
        if want == self.current:
            self._candidate = None
        elif want == self._candidate:
            self.current = want
            self._candidate = None
            self.changes.append((now, want, others))
        else:
            self._candidate = want
