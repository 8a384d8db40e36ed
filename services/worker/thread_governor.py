"""How many intra-op threads a CPU worker runs: one per core, fewer while other processes keep cores busy.

torch's CPU kernels split each operation over their OpenMP threads and wait at its end for all of
them. With a thread on every core, any other busy process on the machine takes one of those cores
for whole time slices, and every operation of the step waits for the thread it displaced. One busy
process beside the worker on 2 cores made a 64-token prefill step 6.5x slower with two threads
(201 ms) and a decode step's p90 118 ms; with one thread they were 49 ms and 24 ms, close to the
quiet machine's (BENCHMARKS.md, "A shared machine: intra-op threads that follow the free cores").
So between commands the worker looks, once per interval, at how much CPU the rest of the machine
used on the cores it may run on (their busy time from /proc/stat, steal included, less this
process's own), and runs one thread fewer per core's worth of it beyond the cores its threads
leave to others (a second worker on the same machine has its own share); the pipeline's own light
services use a fraction of a core and leave it alone. Going back up waits until the others are
clearly quieter (hysteresis), so a load near the threshold does not flip the count every interval.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

INTERVAL_S = 1.0  # how often the machine's load is looked at
SETTLE_S = 0.25  # the look before warmup, whose measured step sets the server's step budget
FEWER_ABOVE = 0.5  # a thread fewer for each core's worth of others' load beyond this much
MORE_BELOW = 0.25  # ...and back only when the others' load is this far below the next core


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """Cumulative seconds: every core's busy time, this process's CPU time, and a wall clock."""

    busy_s: float
    own_s: float
    wall_s: float


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (a container's cpuset, taskset), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def read_cpu_times(cpus: set[int] | None = None, stat_path: str = "/proc/stat") -> CpuTimes | None:
    """Now's `CpuTimes` over `cpus` (default: the usable ones), or None where the kernel does not
    publish /proc/stat (not Linux)."""
    cpus = usable_cpus() if cpus is None else cpus
    try:
        with open(stat_path, encoding="ascii") as stat:
            lines = [line.split() for line in stat if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return None
    busy_ticks = 0
    for fields in lines:
        if int(fields[0][3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
            busy_ticks += user + nice + system + irq + softirq + steal
    own = os.times()
    return CpuTimes(busy_ticks / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.monotonic())


def others_cores(before: CpuTimes, after: CpuTimes) -> float:
    """Cores' worth of CPU that other processes used between two readings."""
    others_s = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, others_s) / max(after.wall_s - before.wall_s, 1e-9)


def threads_for(others_cores: float, max_threads: int, current: int, num_cores: int | None = None) -> int:
    """The thread count for the others' load in cores, given the count now (hysteresis); of
    `num_cores` (default: `max_threads`), those beyond the worker's threads are the others' own."""
    excess = others_cores - ((num_cores or max_threads) - max_threads)

    def wanted(slack: float) -> int:
        return min(max_threads, max(1, max_threads - math.ceil(excess - slack)))

    fewer, more = wanted(FEWER_ABOVE), wanted(MORE_BELOW)
    return fewer if fewer < current else max(more, current)


class ThreadGovernor:
    """`tick()` between commands; it changes torch's intra-op threads when the machine's load says so."""

    def __init__(self, max_threads: int, read: Callable[[], CpuTimes | None] = read_cpu_times,
                 set_threads: Callable[[int], None] = torch.set_num_threads, interval_s: float = INTERVAL_S,
                 num_cores: int | None = None) -> None:
        self.max_threads = self.threads = max_threads
        self.num_cores = max(num_cores or len(usable_cpus()), max_threads)
        self.read = read
        self.set_threads = set_threads
        self.interval_s = interval_s
        self.last = read()
        self.num_changes = 0

    def tick(self) -> int | None:
        """The new thread count when it changed, else None (most calls return after a clock read)."""
        if self.last is None or time.monotonic() - self.last.wall_s < self.interval_s:
            return None
        return self._update()

    def settle(self, window_s: float = SETTLE_S) -> int | None:
        """A look over the next `window_s` now, before warmup times a step with these threads."""
        self.last = self.read()
        time.sleep(window_s)
        return self._update()

    def _update(self) -> int | None:
        now = self.read()
        if now is None or self.last is None:
            return None
        others = others_cores(self.last, now)
        self.last = now
        threads = threads_for(others, self.max_threads, self.threads, self.num_cores)
        if threads == self.threads:
            return None
        logger.info("other processes kept %.2f of %d cores busy: %d intra-op thread(s), was %d",
                    others, self.max_threads, threads, self.threads)
        self.set_threads(threads)
        self.threads = threads
        self.num_changes += 1
        return threads


def for_worker(device: torch.device, adaptive: bool) -> ThreadGovernor | None:
    """The CPU worker's governor, adapting below the thread count it starts with (--num-threads;
    the launcher gives each worker its share of the cores), or None: on an accelerator, with
    --no-cpu-adaptive-threads, or with a single thread to begin with."""
    if device.type != "cpu" or not adaptive or torch.get_num_threads() < 2:
        return None
    return ThreadGovernor(torch.get_num_threads())
