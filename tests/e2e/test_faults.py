"""Faults with real processes: the only worker killed, the scheduler killed, clients that leave,
a failed prefill, and SIGTERM under load. One launched pipeline is shared by the tests that
leave it whole (each starts from a healthy server), SIGTERM gets its own."""

from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import signal
import threading
import time
from collections.abc import Callable

import pytest

from tests.e2e.faults import (
    FAST_FLAGS,
    all_child_pids,
    build_small_vocab_model,
    child_pids,
    health,
    stream,
    wait_for,
)
from tests.e2e.server import LaunchedServer
from ztgi.common.client.sync_client import ZtgiClient

PROMPT = "The capital of France is"  # every id below the small model's vocabulary
BAD_PROMPT = "Hello world"  # 19556 is outside it: the worker fails this prefill
NO_WORKER_TIMEOUT_S = 1.0
RESTART_BACKOFF_S = 3.0  # longer than loss detection + NO_WORKER_TIMEOUT_S: requests fail before a new worker
HEALTH_WINDOW_S = 2.0
LONG = 1500  # tokens: still running when the fault hits


@pytest.fixture(scope="module")
def model_dir(smollm2, tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_small_vocab_model(str(tmp_path_factory.mktemp("small-vocab")), smollm2.path)


def launch(run_dir: str, model_dir: str, *flags: str, own_process_group: bool = False) -> LaunchedServer:
    return LaunchedServer(run_dir, "--model-id", model_dir, *FAST_FLAGS, "--no-worker-timeout-s",
                          str(NO_WORKER_TIMEOUT_S), "--restart-backoff-s", str(RESTART_BACKOFF_S),
                          "--health-window-s", str(HEALTH_WINDOW_S), *flags, own_process_group=own_process_group)


@pytest.fixture(scope="module")
def shared_server(model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    server = launch(str(tmp_path_factory.mktemp("run")), model_dir)
    yield server
    assert server.stop() == 0, server.log


@pytest.fixture
def server(shared_server: LaunchedServer) -> LaunchedServer:
    """The shared pipeline once it is healthy again (a previous test may have killed a part)."""
    wait_for(lambda: health(shared_server)[0] == 200, 60)
    return shared_server


def start_streams(pool, server: LaunchedServer, num_streams: int, min_tokens: int, **kwargs) -> list:
    progress: list = []
    futures = [pool.submit(stream, server, PROMPT, LONG, progress, **kwargs) for _ in range(num_streams)]
    wait_for(lambda: len(progress) >= num_streams * min_tokens, 60, 0.02)
    return futures


@pytest.mark.slow
def test_kill_only_worker_fails_requests_then_serves_again(server: LaunchedServer) -> None:
    """kill -9 of the only worker: in-flight and queued requests fail with a clear error within
    loss detection + no_worker_timeout_s, /health says 503 and why; the launcher's new worker
    serves again and no other process was restarted."""
    pids = all_child_pids(server)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = start_streams(pool, server, 4, 3)
        os.kill(pids["worker"][0], signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: health(server)[0] == 503, 10)
        status, reason = health(server)
        queued = [pool.submit(stream, server, PROMPT, 20) for _ in range(2)]
        outcomes = [future.result() for future in running + queued]
    assert status == 503 and "no worker is ready" in reason, reason
    for outcome in outcomes:
        assert outcome.final is not None and outcome.final["error_type"] == "unhealthy", outcome.final
        assert "No worker is available" in outcome.error
        # 1 s loss detection + 1 s no_worker_timeout_s + ticks; generous for a shared 2-core CI
        assert outcome.ended_at - killed_at < 2.0 + NO_WORKER_TIMEOUT_S + 3.0
    wait_for(lambda: health(server)[0] == 200, 60)
    assert stream(server, PROMPT, 20).error is None
    after = all_child_pids(server)
    assert after["worker"] != pids["worker"] and len(after["worker"]) == 1
    assert {s: p for s, p in after.items() if s != "worker"} == {s: p for s, p in pids.items() if s != "worker"}
    assert "worker[0] exited with code -9; restarting" in server.log


@pytest.mark.slow
def test_scheduler_restart_fails_in_flight_then_same_peers_serve(server: LaunchedServer) -> None:
    """kill -9 of the scheduler: in-flight streams end at once with an error event; within
    seconds the restarted scheduler serves again with the same worker, tokenizer and gateway."""
    pids = all_child_pids(server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = start_streams(pool, server, 4, 3)
        os.kill(pids["scheduler"][0], signal.SIGKILL)
        killed_at = time.monotonic()
        outcomes = [future.result() for future in running]
    for outcome in outcomes:
        assert outcome.final is not None and outcome.final["error_type"] == "unhealthy", outcome.final
        assert "scheduler" in outcome.error
        assert outcome.ended_at - killed_at < 5.0  # the client's liveness is 5 x 200 ms
    recovered_s = wait_for(lambda: stream(server, PROMPT, 10).error is None, 60, 0.5)
    after = all_child_pids(server)
    assert after["scheduler"] != pids["scheduler"]
    assert {s: p for s, p in after.items() if s != "scheduler"} == {s: p for s, p in pids.items() if s != "scheduler"}
    assert "scheduler restarted: dropping cached batches and registering again" in server.log
    # the tokenizer dropped the dead scheduler's requests (their clients had failed them)
    assert re.search(r"scheduler restarted: dropped [1-9]\d* requests of the previous one", server.log), server.log
    print(f"scheduler restart: serving again {recovered_s:.1f} s after the in-flight requests failed")


@pytest.mark.slow
def test_disconnected_clients_leave_nothing_running(server: LaunchedServer) -> None:
    """16 streams dropped mid-way: Stats show zero running and queued within seconds, and no
    token is generated after that."""
    close = threading.Event()
    with ZtgiClient(server.scheduler_url, heartbeat_interval_ms=200) as client, \
            concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = start_streams(pool, server, 16, 2, close_after=2, close_event=close)
        busy = client.stats()
        close.set()
        outcomes = [future.result() for future in futures]
        cleared_s = wait_for(lambda: (lambda s: s.num_running + s.num_queued == 0)(client.stats()), 10, 0.1)
        tokens = client.stats().num_generated_tokens
        time.sleep(0.5)
        assert client.stats().num_generated_tokens == tokens
    assert busy.num_running + busy.num_queued == 16
    assert all(outcome.final is None and len(outcome.texts) >= 2 for outcome in outcomes)
    print(f"16 disconnected streams: zero running and queued {cleared_s:.2f} s after the last close")


@pytest.mark.slow
def test_quiet_worker_passes_a_canary_for_health(server: LaunchedServer) -> None:
    """After health_window_s without a request, /health is 200 only once the real worker has
    run a one-token canary."""
    time.sleep(HEALTH_WINDOW_S + 0.5)
    num_canaries = server.log.count("one-token canary on")
    assert health(server) == (200, "")
    wait_for(lambda: server.log.count("one-token canary on") > num_canaries, 5)  # the log comes through pipes
    assert "failed the health canary" not in server.log


@pytest.mark.slow
def test_failed_prefill_fails_only_its_batch(server: LaunchedServer) -> None:
    """A prefill the worker rejects (a token outside the model's vocabulary) fails only its
    request with a generation error (424); the running stream beside it completes unchanged."""
    log_start = len(server.log_lines)  # the module's server: earlier tests restarted the scheduler
    expected = stream(server, PROMPT, 200)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        progress: list = []
        running = pool.submit(stream, server, PROMPT, 200, progress)
        wait_for(lambda: len(progress) >= 3, 60, 0.02)
        failed = server.post("/generate", {"inputs": BAD_PROMPT, "parameters": {"max_new_tokens": 5}})
        outcome = running.result()
    assert failed.status_code == 424, failed.text
    assert failed.json()["error_type"] == "generation" and "outside the vocabulary" in failed.json()["error"]
    assert outcome.error is None and outcome.texts == expected.texts
    assert stream(server, PROMPT, 5).error is None
    assert not any("answered command" in line for line in server.log_lines[log_start:])  # none untracked


def signal_launcher(server: LaunchedServer, signum: int) -> None:
    server.process.send_signal(signum)


def signal_group_twice(server: LaunchedServer, signum: int) -> None:
    """A terminal's Ctrl-C (the signal to the launcher's whole group), then, during the drain, a
    second stop signal to the group (an impatient init)."""
    os.killpg(server.process.pid, signum)
    time.sleep(0.5)
    os.killpg(server.process.pid, signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "send"), [(signal.SIGTERM, signal_launcher), (signal.SIGHUP, signal_launcher),
                                              (signal.SIGINT, signal_group_twice)],
                         ids=["sigterm", "sighup", "sigint-to-the-group-then-sigterm"])
def test_stop_signal_under_load_drains_and_exits_clean(model_dir: str, tmp_path, signum: int,
                                                       send: Callable[[LaunchedServer, int], None]) -> None:
    """A stop signal mid-load: SIGTERM or SIGHUP to the launcher, or SIGINT to its whole process
    group and a second signal during the drain: every in-flight stream completes, every process
    exits 0, and no socket file is left in the run directory. (Before: SIGHUP killed the launcher
    at once, streams cut without an event; a group signal stopped the tokenizer and the worker by
    signal while the scheduler drained.)"""
    run_dir = str(tmp_path / "run")
    server = launch(run_dir, model_dir, "--drain-timeout-s", "20", own_process_group=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            progress: list = []
            futures = [pool.submit(stream, server, PROMPT, 300, progress) for _ in range(8)]
            wait_for(lambda: len(progress) >= 8 * 3, 60, 0.02)
            send(server, signum)
            outcomes = [future.result() for future in futures]
        assert server.process.wait(timeout=60) == 0, server.log
    finally:
        server.stop()
    for outcome in outcomes:
        assert outcome.error is None and len(outcome.texts) == 300, outcome.final
    for name in ("gateway[0]", "scheduler", "tokenizer[0]", "worker[0]"):
        assert f"{name} exited with code 0" in server.log, server.log
    assert "not all cleanly" not in server.log
    assert glob.glob(os.path.join(run_dir, "*.sock")) == []
    assert child_pids(server, "worker") == []
