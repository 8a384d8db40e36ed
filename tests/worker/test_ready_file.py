"""A worker's --ready-file, driven by a test playing the scheduler: written only while the
scheduler counts the worker and it is warmed up (what `ztgi probe` reports to Kubernetes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.worker.test_service import HEARTBEAT_MS, REPO_ROOT, START_TIMEOUT_S, SchedulerSide
from ztgi.common.child_process import stop_process
from ztgi.common.messages import Hello, Warmup, WarmupResult

QUIET_S = 10 * HEARTBEAT_MS / 1000  # ten heartbeats answered


def answer_heartbeats_for(side: SchedulerSide, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        if side.router.poll(remaining * 1000):
            side.receive(object, timeout_s=remaining)  # answers the heartbeat on the way


def warm_up(side: SchedulerSide) -> None:
    side.send(Warmup(1, max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=400,
                     max_batch_total_tokens=None))
    side.receive(WarmupResult)


def test_the_ready_file_follows_registration_and_warmup(tiny_model_dir: str, tmp_path: Path) -> None:
    """Registered but not warmed up: no file. Warmed up: written at each heartbeat answer. Dropped
    by the scheduler (it says Hello again): not written until it is warmed up again. Stopped: removed."""
    ready = tmp_path / "ready"
    ready.write_text("left by an earlier container")
    scheduler_url = f"ipc://{tmp_path}"
    side = SchedulerSide(scheduler_url)
    process = subprocess.Popen(
        [sys.executable, "-m", "ztgi.services.worker", "--scheduler-url", scheduler_url, "--model-id", tiny_model_dir,
         "--dtype", "float32", "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--memory-budget-mb", "32",
         "--ready-file", str(ready)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        side.receive(Hello, START_TIMEOUT_S)
        assert not ready.exists()  # the old one is gone at start
        answer_heartbeats_for(side, QUIET_S)
        assert not ready.exists()
        warm_up(side)
        answer_heartbeats_for(side, QUIET_S)
        assert time.time() - ready.stat().st_mtime < QUIET_S

        side.registered = False
        side.receive(Hello)
        side.registered = True
        written = ready.stat().st_mtime
        answer_heartbeats_for(side, QUIET_S)
        assert ready.stat().st_mtime == written  # registered again, not warmed up yet
        warm_up(side)
        answer_heartbeats_for(side, QUIET_S)
        assert ready.stat().st_mtime > written

        assert stop_process(process, 15) == 0
        assert not ready.exists()
    finally:
        stop_process(process, 10)
        side.close()
