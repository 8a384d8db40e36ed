"""A resumed request continues its own sampling state: a pool too small for every request at once
preempts them, and a worker killed mid-run sends its requests to the other one; either way each
answer equals the one it gets alone (float32), and a grammar's answer stays valid against its schema.
Before `WorkerRequest.num_generated`, a resumed request's grammar restarted from its start (invalid
JSON answered 200) and its seeded generator from its seed (another sampled text)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from collections.abc import Callable, Iterator

import jsonschema  # type: ignore[import-untyped]
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import LaunchedServer
from tests.e2e.test_process_loss import child_pids

PROMPT = "Write the list of numbers that the user asked for, as JSON, and nothing else please: "
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
          "minItems": 8, "maxItems": 8}
CONSTRAINED = {"max_new_tokens": 60, "grammar": {"type": "json", "value": SCHEMA}}
SAMPLED = {"max_new_tokens": 60, "ignore_eos": True, "do_sample": True, "temperature": 1.0}
PENALIZED = {"max_new_tokens": 60, "ignore_eos": True, "repetition_penalty": 1.5, "frequency_penalty": 0.5}
BODIES = ([{"inputs": PROMPT + str(i), "parameters": CONSTRAINED} for i in range(4)]
          + [{"inputs": PROMPT + str(i), "parameters": {**SAMPLED, "seed": i}} for i in range(2)]
          + [{"inputs": PROMPT + str(i), "parameters": PENALIZED} for i in range(2)])


@pytest.fixture(scope="module")
def server(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """Two workers of 128-token pools (each request needs up to ~100): two requests at once preempt."""
    launched = LaunchedServer(
        str(tmp_path_factory.mktemp("resume") / "run"), "--model-id", tiny_model_dir, "--dtype", "float32",
        "--num-workers", "2", "--max-batch-total-tokens", "128", "--max-total-tokens", "128",
        "--max-input-tokens", "64", "--speculate", "4")
    yield launched
    launched.stop()


def generate(server: LaunchedServer, body: dict) -> str:
    response = server.post("/generate", body)
    assert response.status_code == 200, response.text
    return response.json()["generated_text"]


def concurrently(server: LaunchedServer, on_started: Callable[[], None] | None = None) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(len(BODIES)) as pool:
        futures = [pool.submit(generate, server, body) for body in BODIES]
        if on_started is not None:
            on_started()
        return [future.result() for future in futures]


def preemptions(server: LaunchedServer) -> float:
    families = text_string_to_metric_families(server.get("/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name.startswith("ztgi_preemptions"))


def assert_valid(texts: list[str]) -> None:
    for text in texts[:4]:
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.slow
def test_preempted_requests_continue_their_grammar_generator_and_penalties(server: LaunchedServer) -> None:
    alone = [generate(server, body) for body in BODIES]
    assert_valid(alone)
    before = preemptions(server)
    together = concurrently(server)
    assert preemptions(server) > before, "the small pool was meant to preempt"
    assert_valid(together)
    assert together == alone


@pytest.mark.slow
def test_a_killed_workers_requests_continue_their_state_on_the_other(server: LaunchedServer) -> None:
    alone = [generate(server, body) for body in BODIES]

    def kill_a_worker() -> None:
        time.sleep(1.0)
        os.kill(child_pids(server, "worker")[0], signal.SIGKILL)

    together = concurrently(server, kill_a_worker)
    assert_valid(together)
    assert together == alone
