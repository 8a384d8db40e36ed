"""`ztgi launch` while its workers start: requests sent before a worker is ready wait for it, and
limits no worker can meet end the launch at once, saying why."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import requests

from ztgi.common.child_process import stop_process
from ztgi.common.free_ports import free_port

TINY_FLAGS = ("--dtype", "float32", "--max-input-tokens", "64", "--max-total-tokens", "128")


def launch(model_dir: str | None, run_dir: str, port: int, *flags: str) -> subprocess.Popen:
    """`ztgi launch` of `model_dir` (None: the embedded SmolLM2) with small request limits."""
    model = ["--model-id", model_dir] if model_dir is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "ztgi.services.launcher", *model, "--run-dir", run_dir,
         "--port", str(port), *TINY_FLAGS, *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def health(url: str) -> int | None:
    try:
        return requests.get(url + "/health", timeout=5).status_code
    except requests.ConnectionError:
        return None


def test_requests_sent_before_a_worker_is_ready_wait_for_it(tiny_model_dir: str, tmp_path: pathlib.Path) -> None:
    """With --no-worker-timeout-s 0.5, requests sent as soon as the gateway answers (/health still
    503: the worker loads and warms up) all complete: they wait the start-up grace, not 0.5 s
    (before: they failed with 503 "No worker is available" once it passed)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = launch(tiny_model_dir, str(tmp_path / "run"), port, "--no-worker-timeout-s", "0.5",
                     "--startup-grace-s", "120")
    try:
        deadline = time.monotonic() + 120
        while (status := health(url)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 503, f"the gateway should answer before the worker is ready, got {status}"
        body: Any = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: requests.post(url + "/generate", json=body, timeout=120), range(4)))
        assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    finally:
        stop_process(process, 60)


@pytest.mark.slow
def test_a_kv_cache_too_small_for_one_request_ends_the_launch_saying_why(tmp_path: pathlib.Path) -> None:
    """SmolLM2 with --memory-budget-mb 1 (a pool of a few dozen tokens) for requests of up to 128:
    the worker and `ztgi launch` exit non-zero, the message naming both numbers and the flags that
    fix it (before: warmup was refused, the worker registered again, and again, /health stayed 503
    and the launcher never exited). The tiny model cannot show it: 1 MiB holds 2048 of its tokens."""
    process = launch(None, str(tmp_path / "run"), free_port(), "--memory-budget-mb", "1", "--restart")
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        stop_process(process, 10)
    assert process.returncode == 1, output
    assert re.search(r"the KV cache holds \d+ tokens, less than one request's max_total_tokens \(128\)", output)
    assert "--max-total-tokens" in output and "--memory-budget-mb" in output and "--max-batch-total-tokens" in output
    assert "worker[0] exited with code 1" in output
