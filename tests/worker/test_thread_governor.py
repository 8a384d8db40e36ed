"""The CPU worker's intra-op threads follow the cores other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from ztgi.common.config import parse_config
from ztgi.services.worker import thread_governor
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.thread_governor import CpuTimes, ThreadGovernor, others_cores, read_cpu_times, threads_for


@pytest.mark.parametrize(("others", "max_threads", "current", "expected"), [
    (0.1, 2, 2, 2),  # the pipeline's own services: nothing to give up
    (0.6, 2, 2, 1),  # a busy neighbour: one thread fewer
    (0.4, 2, 1, 1),  # not quiet enough yet to take the core back (hysteresis)
    (0.2, 2, 1, 2),  # quiet again
    (3.5, 2, 2, 1),  # never fewer than one
    (1.7, 4, 4, 2),  # two cores' worth of others on four
    (1.4, 4, 2, 2),  # ...and back to three only below 1.25
    (1.2, 4, 2, 3),
])
def test_threads_follow_the_others_load_with_hysteresis(others, max_threads, current, expected) -> None:
    assert threads_for(others, max_threads, current) == expected


def test_cores_beyond_the_workers_threads_are_the_others_own() -> None:
    """Two workers of two threads on four cores: each sees the other's two cores busy and keeps
    both threads; a neighbour busy on a third core more costs each a thread."""
    assert threads_for(2.0, 2, 2, num_cores=4) == 2
    assert threads_for(3.0, 2, 2, num_cores=4) == 1
    assert threads_for(2.2, 2, 1, num_cores=4) == 2


def test_cpu_times_cover_the_usable_cpus_only(tmp_path) -> None:
    """Busy ticks (user, nice, system, irq, softirq, steal) summed over the CPUs given, from the
    per-CPU lines; the all-CPUs line is not counted twice."""
    import os

    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9 0 0\n"
                    "cpu0 100 1 10 500 7 2 3 4 0 0\n"
                    "cpu1 200 0 20 400 0 0 0 0 0 0\n"
                    "intr 1 2 3\n")
    hz = os.sysconf("SC_CLK_TCK")
    only0 = read_cpu_times({0}, str(stat))
    both = read_cpu_times({0, 1}, str(stat))
    assert only0 is not None and both is not None
    assert only0.busy_s == pytest.approx(120 / hz) and both.busy_s == pytest.approx(340 / hz)
    assert read_cpu_times({0}, str(tmp_path / "missing")) is None


def test_the_governor_looks_once_per_interval_and_sets_what_changed() -> None:
    """Readings a second apart: quiet, a neighbour busy on a core, quiet again. The count follows,
    set once per change, and a tick within the interval reads nothing."""
    start = time.monotonic()
    readings = iter([CpuTimes(0.0, 0.0, start - 3.0),
                     CpuTimes(1.8, 1.7, start - 2.0),  # the worker's own work and 0.1 core of others
                     CpuTimes(3.6, 2.6, start - 1.0),  # 0.9 core of others
                     CpuTimes(4.6, 3.5, start + 100.0)])  # quiet again; "now" stays within the interval
    set_to: list[int] = []

    def read() -> CpuTimes:
        return next(readings)

    governor = ThreadGovernor(2, read, set_to.append, interval_s=0.5)
    assert [governor.tick(), governor.tick(), governor.tick()] == [None, 1, 2]
    assert set_to == [1, 2] and governor.threads == 2 and governor.num_changes == 2
    assert governor.tick() is None  # the last reading is now: within the interval, nothing read


def test_a_busy_process_shows_as_others_load_in_real_readings() -> None:
    """/proc/stat and this process's own times: a spinning child process counts as about a core of
    others' load while this process sleeps; a governor reading the machine gives that core up."""
    if read_cpu_times() is None:
        pytest.skip("no /proc/stat on this system")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = read_cpu_times()
        set_to: list[int] = []
        governor = ThreadGovernor(2, set_threads=set_to.append, interval_s=0.8, num_cores=2)  # as on 2 cores
        time.sleep(1.0)
        after = read_cpu_times()
        assert before is not None and after is not None
        assert others_cores(before, after) > 0.6
        assert governor.tick() == 1 and set_to == [1]
        settled: list[int] = []
        assert ThreadGovernor(2, set_threads=settled.append, num_cores=2).settle() == 1 and settled == [1]
    finally:
        spinner.kill()
        spinner.wait()


def test_only_a_cpu_worker_with_threads_to_spare_adapts(monkeypatch) -> None:
    """Below the count it starts with (the launcher's --num-threads share); off by flag, on an
    accelerator, or with one thread."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    cpu = torch.device("cpu")
    governor = thread_governor.for_worker(cpu, True)
    assert isinstance(governor, ThreadGovernor) and governor.max_threads == 2
    assert thread_governor.for_worker(cpu, False) is None
    assert thread_governor.for_worker(torch.device("cuda"), True) is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert thread_governor.for_worker(cpu, True) is None


def test_adaptive_threads_flag(monkeypatch) -> None:
    monkeypatch.delenv("ZTGI_CPU_ADAPTIVE_THREADS", raising=False)
    assert parse_config(WorkerConfig, []).cpu_adaptive_threads is True
    assert parse_config(WorkerConfig, ["--no-cpu-adaptive-threads"]).cpu_adaptive_threads is False
    monkeypatch.setenv("ZTGI_CPU_ADAPTIVE_THREADS", "false")
    assert parse_config(WorkerConfig, []).cpu_adaptive_threads is False
