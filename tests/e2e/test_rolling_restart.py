"""SIGTERM to a worker under load drains it: a rolling restart of both workers under 16 streams
finishes every stream where it runs (nothing resumed elsewhere), and a drain too short for long
streams hands them to the other worker at once instead of at the deadline."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests

from tests.e2e.faults import wait_for
from tests.e2e.server import LaunchedServer
from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy

PROMPTS = ["The capital of France is", "Once upon a time", "The best way to learn is", "Water boils at"]
# A drain ends when its streams do: the rolling restart's is long enough for 16 short streams on the
# slowest 2-core machine CI runs on (two workers sharing its cores, 0.3 s a step on one with AVX2 alone),
# the hand-back test's too short for long streams on the fastest.
ROLLING_DRAIN_S = 20.0  # below --shutdown-timeout-s (30 by default)
DRAIN_TIMEOUT_S = 5.0
SHORT = 20  # tokens: finishes well within the rolling restart's drain
LONG = 200  # tokens: could not finish within DRAIN_TIMEOUT_S
NUM_STREAMS = 16


def launch(tmp_path_factory: pytest.TempPathFactory, drain_s: float) -> LaunchedServer:
    # float32: a stream resumed on the other worker re-prefills, whose logits differ from decode's
    # in the last bits only (tests/e2e/test_process_loss.py)
    return LaunchedServer(str(tmp_path_factory.mktemp("run")), "--num-workers", "2", "--dtype", "float32",
                          "--drain-timeout-s", str(drain_s), "--restart-backoff-s", "0.5")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    launched = launch(tmp_path_factory, ROLLING_DRAIN_S)
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def short_drain_server(tmp_path_factory: pytest.TempPathFactory):
    launched = launch(tmp_path_factory, DRAIN_TIMEOUT_S)
    yield launched
    assert launched.stop() == 0, launched.log


def stream(server: LaunchedServer, prompt: str, max_new_tokens: int, started: list | None = None) -> GreedyStream:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "top_n_tokens": 2}}
    streamed = GreedyStream()
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=300) as response:
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                assert "error" not in event, event
                streamed.add(event)
                if started is not None:
                    started.append(1)
    return streamed


def worker_pid(server: LaunchedServer, index: int) -> int:
    out = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", f"services.worker --worker-index {index} "],
                         capture_output=True, text=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


def requeued(server: LaunchedServer) -> dict[str, float]:
    """ztgi_requests_requeued by reason, from /metrics."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return {reason: float(value) for reason, value in
            re.findall(r'^ztgi_requests_requeued_total\{reason="(\w+)"\} (\S+)$', text, re.MULTILINE)}


def restart_worker(server: LaunchedServer, index: int) -> float:
    """SIGTERM to worker[index]; waits for its exit (code 0) and its successor's warmup; the
    seconds from the signal to the exit."""
    exits = f"worker[{index}] exited with code"
    num_exits, num_ready = server.log.count(exits), server.log.count(" ready: max_batch_total_tokens")
    os.kill(worker_pid(server, index), signal.SIGTERM)
    signalled_at = time.monotonic()
    wait_for(lambda: server.log.count(exits) > num_exits, 60, 0.02)
    drain_s = time.monotonic() - signalled_at
    assert server.log.count(f"{exits} 0; restarting") == num_exits + 1, server.log
    wait_for(lambda: server.log.count(" ready: max_batch_total_tokens") > num_ready, 120, 0.1)
    return drain_s


@pytest.mark.slow
def test_rolling_restart_of_both_workers_under_16_streams_finishes_every_stream_where_it_runs(
        server: LaunchedServer) -> None:
    expected = {prompt: stream(server, prompt, SHORT) for prompt in PROMPTS}
    finished: list[tuple[str, GreedyStream]] = []
    stop = threading.Event()

    def client(offset: int) -> None:
        for prompt in itertools.islice(itertools.cycle(PROMPTS), offset, None):
            if stop.is_set():
                return
            finished.append((prompt, stream(server, prompt, SHORT)))

    with concurrent.futures.ThreadPoolExecutor(NUM_STREAMS) as pool:
        clients = [pool.submit(client, i) for i in range(NUM_STREAMS)]
        wait_for(lambda: len(finished) >= NUM_STREAMS, 120)
        drains = [restart_worker(server, index) for index in (0, 1)]
        num_before = len(finished)
        wait_for(lambda: len(finished) >= num_before + NUM_STREAMS, 120)  # the restarted workers serve
        stop.set()
        for future in clients:
            future.result()  # a stream's error event fails its client
    for prompt, streamed in finished:
        assert_same_greedy(expected[prompt], streamed)
    assert len(re.findall(r"worker \S+ drains: \d+ running requests finish there", server.log)) == 2, server.log
    assert requeued(server) == {}, server.log  # nothing resumed elsewhere: each stream ended where it ran
    print(f"rolling restart: {len(finished)} streams completed; SIGTERM to exit: "
          f"{', '.join(f'{s:.2f} s' for s in drains)} (drain timeout {ROLLING_DRAIN_S:g} s)")


@pytest.mark.slow
def test_a_drain_too_short_for_long_streams_hands_them_to_the_other_worker_at_once(
        short_drain_server: LaunchedServer) -> None:
    server = short_drain_server
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        expected = list(pool.map(lambda prompt: stream(server, prompt, LONG), PROMPTS))
    started: list = []
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(stream, server, prompt, LONG, started) for prompt in PROMPTS]
        wait_for(lambda: len(started) >= 3 * len(PROMPTS), 120, 0.02)
        drain_s = restart_worker(server, 0)
        results = [future.result() for future in futures]
    for reference, resumed in zip(expected, results):
        assert_same_greedy(reference, resumed)
    assert re.search(r"requests could not finish in its \S+ s left, handed back", server.log), server.log
    counts = requeued(server)
    assert counts.get("handed_back", 0) >= 1 and "worker_lost" not in counts, counts
    assert drain_s < DRAIN_TIMEOUT_S, drain_s  # handed back, it exited without waiting out its grace
    print(f"hand-back: {counts['handed_back']:g} long streams resumed on the other worker; "
          f"SIGTERM to exit {drain_s:.2f} s")
