"""How many llama.cpp threads to decode with now: fewer while other processes keep the CPUs busy.

ggml's CPU backend splits every graph node over its threads and makes them
meet at a spin barrier after each node (``ggml_barrier`` in ggml-cpu.c). When
other processes take cores, the scheduler deschedules one of those threads and
the others spin until it runs again, at every node. Measured on a 2-core VM
with two ``while True: pass`` loops running (SmolLM2, a prompt-cache RAM hit:
4 prompt tokens and one decode): median time to first token 4.9 s with 2
threads, 0.34 s with 1 thread (``scripts/bench_cache.py --busy 2`` shows the
same row). llama.cpp leaves this to the user (``-t``); a runner that users
start next to their other work should not.

The stall is paid per graph node, whatever the batch size, while the work per
node grows with it: a large prefill chunk still gains from every thread (the
same VM and load: a 2,200-token cold prefill took 70 s on 2 threads, 99 s on 1).
So only small batches (decode steps and short prompt tails, at most
:data:`SMALL_BATCH` tokens) use the lowered count; larger ones keep the
configured count.

Rule (:class:`ThreadBudget`): ``n = min(configured, max(1, n_cpu - others))``
where ``n_cpu`` is the CPUs this process may run on (``sched_getaffinity``) and
``others`` the runnable tasks on the machine that are not this process's
threads (the running count of ``/proc/loadavg`` minus this process's threads in
state ``R`` from ``/proc/self/task/*/stat``). The first count comes from
one sample when the engine starts (:meth:`ThreadBudget.prime`: a one-shot CLI
request on a loaded machine is short and must not run on the wrong count);
after that it is sampled at most every ``interval`` seconds and a new count is
applied only when two samples in a row agree, so one short spike does not flip it. Only when ``num_thread`` is left to
ollapy (0); an explicit ``num_thread`` is always used as it is. Where ``/proc``
is missing (macOS, Windows) the configured count is kept.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
SMALL_BATCH = 64  # tokens: batches up to this size decode on the lowered thread count under load


def read_others_runnable(proc: Path = PROC) -> int | None:
    """Runnable tasks on the machine that are not threads of this process; None when ``/proc`` cannot tell."""
    try:
        running = int((proc / "loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    own = 0
    try:
        for task in (proc / "self" / "task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # the thread ended
            if stat[stat.rfind(")") + 2:stat.rfind(")") + 3] == "R":
                own += 1
    except OSError:
        return None
    return max(0, running - own)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class ThreadBudget:
    """The decode thread count for an engine whose configured count is ``configured``.

    ``adaptive`` False (an explicit ``num_thread``) always answers
    ``configured``. :meth:`threads` is called by the engine loop before each
    decode; it costs a few small ``/proc`` reads at most once per ``interval``
    seconds. ``current`` is the lowered count for small batches; ``changes``
    records every change of it as ``(monotonic seconds, threads,
    others_runnable)`` (read by tests and the debug log).
    """

    def __init__(self, configured: int, adaptive: bool = True, *, interval: float = 0.25,
                 n_cpu: int | None = None, read_others: Callable[[], int | None] = read_others_runnable,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.configured = max(1, configured)
        self.adaptive = adaptive and self.configured > 1
        self.interval = interval
        self.n_cpu = n_cpu or usable_cpus()
        self._read_others = read_others
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
        """Threads for ``others`` runnable foreign tasks: ``min(configured, max(1, n_cpu - others))``."""
        return min(self.configured, max(1, self.n_cpu - others))

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
