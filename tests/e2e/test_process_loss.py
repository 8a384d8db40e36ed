"""kill -9 of a worker or a tokenizer with a second one up, and a tokenizer frozen past the
heartbeat window and resumed: every stream completes unchanged (up to a float near-tie)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests

from tests.e2e.server import LaunchedServer
from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The best way to learn is",
           "Water boils at", "My favourite food is", "import numpy as np", "The sun is"]


def child_pids(server: LaunchedServer, service: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(server.process.pid), "-f", f"services.{service}"],
                         capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def stream(server: LaunchedServer, prompt: str, started: list, max_new_tokens: int = 60) -> GreedyStream:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "top_n_tokens": 2}}
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=120) as response:
        streamed = GreedyStream()
        for line in response.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                assert "error" not in event, event
                streamed.add(event)
                started.append(1)
        return streamed


def undisturbed(server: LaunchedServer) -> list[GreedyStream]:
    """Every prompt's greedy text, streamed all at once with nothing killed (batching leaves greedy
    text unchanged, which tests/e2e/test_pipeline.py pins)."""
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda prompt: stream(server, prompt, []), PROMPTS))


def streams_killing(server: LaunchedServer, service: str, freeze_s: float | None = None) -> list[GreedyStream]:
    """The same streams, with kill -9 of the first `service` child once 3 tokens per stream have
    arrived (or, with `freeze_s`, SIGSTOP for that long, then SIGCONT)."""
    started: list = []
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(stream, server, prompt, started) for prompt in PROMPTS]
        while len(started) < 3 * len(PROMPTS):
            time.sleep(0.05)
        pid = child_pids(server, service)[0]
        if freeze_s is None:
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(freeze_s)
            os.kill(pid, signal.SIGCONT)
        try:
            return [future.result() for future in futures]
        except requests.RequestException as exc:  # a stream that hangs: what the services said meanwhile
            raise AssertionError(f"a stream failed ({exc}); the server's log:\n{server.log}") from exc


@pytest.mark.slow
def test_kill_worker_streams_resume_on_the_other(tmp_path) -> None:
    """All 8 streams complete after kill -9 of a worker, each equal to its undisturbed greedy text
    (up to a float near-tie: tests/e2e/greedy_parity.py), with the default placement (round-robin
    losing a worker: tests/scheduler/test_placement.py)."""
    placement = "cache-aware"
    # float32: a resumed stream re-prefills its prompt + tokens so far in a chunk, whose logits differ
    # from the decode steps' in the last bits (bfloat16's rounding would part texts far more often)
    server = LaunchedServer(str(tmp_path / "run"), "--num-workers", "2", "--max-batch-prefill-tokens", "4096",
                            "--dtype", "float32", "--placement", placement)
    try:
        assert requests.get(server.url + "/info", timeout=10).json()["placement"] == placement
        expected = undisturbed(server)
        for reference, resumed in zip(expected, streams_killing(server, "worker")):
            assert_same_greedy(reference, resumed)
        # the killed worker's connection closed: it is lost at once, not after its heartbeats
        assert re.search(r"lost \(disconnected\): [1-9]\d* requests go back", server.log), server.log
    finally:
        assert server.stop() == 0, server.log


@pytest.mark.slow
def test_frozen_then_killed_tokenizer_streams_are_adopted(tmp_path) -> None:
    """All 8 streams complete, each equal to its undisturbed text, after a tokenizer is frozen
    past the heartbeat window and resumed (its late answers to jobs handed over are dropped),
    and again after kill -9 of a tokenizer."""
    server = LaunchedServer(str(tmp_path / "run"), "--num-tokenizers", "2", "--dtype", "float32",
                            "--heartbeat-interval-ms", "250",
                            "--heartbeat-misses", "8")
    try:
        expected = undisturbed(server)
        # 3 s: past the 2 s window (a busy machine delays a live tokenizer's heartbeats by a second at
        # times), and short of the streams' end, so its late answers arrive mid-stream
        for reference, adopted in zip(expected, streams_killing(server, "tokenizer", freeze_s=3.0)):
            assert_same_greedy(reference, adopted)
        assert re.search(r"lost \(missed heartbeats\): .*[1-9]\d* requests to adopt", server.log), server.log
        before_kill = len(server.log)
        for reference, adopted in zip(expected, streams_killing(server, "tokenizer")):
            assert_same_greedy(reference, adopted)
        # the scheduler hears of the end of the process at once, unless a loaded machine kept the
        # tokenizer's last heartbeats late enough that its window ran out first: either way it is lost once
        assert re.search(r"lost \((disconnected|missed heartbeats)\): .*[1-9]\d* requests to adopt",
                         server.log[before_kill:]), server.log
    finally:
        assert server.stop() == 0, server.log

