"""A frozen worker that resumes, and a killed one, as an operator would see them: real processes,
`kill -STOP`/`kill -CONT` and `kill -9`, /health and streams over HTTP."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import pytest

from tests.e2e.faults import FAST_FLAGS, build_small_vocab_model, child_pids, health, stream, wait_for
from tests.e2e.server import LaunchedServer

PROMPT = "The capital of France is"
HEARTBEAT_MS = 200
HEARTBEAT_MISSES = 5  # a 1 s window: a kill noticed within half of it was not noticed by heartbeats
WINDOW_S = HEARTBEAT_MS * HEARTBEAT_MISSES / 1000
NUM_TOKENS = 300


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory: pytest.TempPathFactory):
    model_dir = build_small_vocab_model(str(tmp_path_factory.mktemp("small-vocab")), smollm2.path)
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", model_dir, *FAST_FLAGS,
                              "--heartbeat-misses", str(HEARTBEAT_MISSES), "--no-worker-timeout-s", "60")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.mark.slow
def test_frozen_worker_rejoins_and_serves_its_stream_once(server: LaunchedServer) -> None:
    """The only worker frozen past the heartbeat window mid-stream, then resumed: it registers
    again by itself (no process restarted), the stream completes with every token once, equal
    to the undisturbed greedy text."""
    expected = stream(server, PROMPT, NUM_TOKENS)
    (worker_pid,) = child_pids(server, "worker")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        progress: list = []
        running = pool.submit(stream, server, PROMPT, NUM_TOKENS, progress)
        wait_for(lambda: len(progress) >= 3, 60, 0.01)
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            wait_for(lambda: health(server)[0] == 503, WINDOW_S + 5, 0.1)  # dropped: missed heartbeats
            status, reason = health(server)
        finally:
            os.kill(worker_pid, signal.SIGCONT)
        rejoined_s = wait_for(lambda: health(server)[0] == 200, 30, 0.1)
        outcome = running.result()
    assert status == 503 and "lost" in reason and "missed heartbeats" in reason, reason
    assert outcome.error is None and outcome.texts == expected.texts, outcome.final
    assert child_pids(server, "worker") == [worker_pid]
    assert "the scheduler no longer knows this worker" in server.log
    print(f"frozen worker: serving again {rejoined_s:.1f} s after SIGCONT")


def test_health_notices_a_killed_worker_at_once(server: LaunchedServer) -> None:
    """kill -9 of the only worker: /health is 503 naming the closed connection well within the
    heartbeat window; the launcher's new worker then serves."""
    wait_for(lambda: health(server)[0] == 200, 60)
    (worker_pid,) = child_pids(server, "worker")
    os.kill(worker_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: health(server)[0] == 503, 10, 0.02)
    noticed_s = time.monotonic() - killed_at
    status, reason = health(server)
    assert noticed_s < WINDOW_S / 2, (noticed_s, reason)
    assert "no worker is ready" in reason and "(disconnected)" in reason, reason
    wait_for(lambda: health(server)[0] == 200, 120, 0.2)
    assert stream(server, PROMPT, 10).error is None
    print(f"killed worker: /health 503 after {noticed_s:.2f} s (heartbeat window {WINDOW_S:g} s)")
