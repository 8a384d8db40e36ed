"""Health, info, liveness and lifecycle of the gateway process."""

from __future__ import annotations

import shutil
import threading
import time

import requests

from tests.gateway.conftest import GatewayProcess, new_run_dir
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, token_steps
from tests.gateway.sse_reader import iter_events
from ztgi.common.messages import Cancel, Generate, Query


def test_ping_answers_200(gateway: GatewayProcess) -> None:
    """GET /ping is 200 from the gateway alone."""
    assert requests.get(gateway.url + "/ping", timeout=5).status_code == 200


def test_health_follows_the_scheduler(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """GET /health is 200 when the scheduler is healthy, else 503 with its reason."""
    assert requests.get(gateway.url + "/health", timeout=5).status_code == 200
    assert scheduler.messages(Query)[-1].kind == "health"
    scheduler.health = (False, "no worker is ready")
    response = requests.get(gateway.url + "/health", timeout=5)
    assert response.status_code == 503
    assert response.json() == {"error": "no worker is ready", "error_type": "healthcheck"}


def test_info_has_tgi_fields(gateway: GatewayProcess, schemas: dict) -> None:
    """GET /info answers TGI's Info (schema-valid) from the scheduler's InfoReply."""
    info = requests.get(gateway.url + "/info", timeout=5).json()
    validate(info, "Info", schemas)
    assert (info["model_id"], info["model_dtype"], info["model_device_type"]) == ("test/tiny", "float32", "cpu")
    assert (info["router"], info["validation_workers"], info["max_batch_total_tokens"]) == ("ztgi", 2, 16384)
    for name in ("max_concurrent_requests", "max_best_of", "max_stop_sequences", "max_input_tokens",
                 "max_total_tokens", "waiting_served_ratio", "max_waiting_tokens", "max_batch_size", "version"):
        assert name in info


def test_no_scheduler_gives_503() -> None:
    """With no scheduler bound, /health, /info and /generate answer 503 quickly."""
    run_dir = new_run_dir()
    gateway = GatewayProcess(f"ipc://{run_dir}")
    try:
        started = time.monotonic()
        for method, path in (("post", "/generate"), ("get", "/health"), ("get", "/info")):
            response = requests.request(method, gateway.url + path, json={"inputs": "Hi"}, timeout=5)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["error_type"] == "unhealthy"
            assert "unreachable" in response.json()["error"]
        assert time.monotonic() - started < 3
    finally:
        returncode, output = gateway.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    assert returncode == 0, output


def test_scheduler_restart_fails_in_flight_streams_fast() -> None:
    """A scheduler restart (new nonce) ends open streams with an 'unhealthy' error event at once."""
    run_dir = new_run_dir()
    scheduler = ScriptedScheduler(f"ipc://{run_dir}").start()
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 1000)
    gateway = GatewayProcess(f"ipc://{run_dir}")
    try:
        gateway.wait_healthy()
        response = requests.post(gateway.url + "/generate_stream", json={"inputs": "Hi"}, stream=True, timeout=10)
        assert response.status_code == 200, response.text
        events = iter_events(response)
        next(events)
        scheduler.restart()
        restarted = time.monotonic()
        last = [e for e in events][-1]
        assert last == {"error": "scheduler restarted", "error_type": "unhealthy"}
        assert time.monotonic() - restarted < 3.0  # the message, not the time, tells it from liveness
    finally:
        returncode, output = gateway.stop()
        scheduler.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    assert returncode == 0, output


def test_sigterm_ends_open_streams_with_a_reason_and_exits_0() -> None:
    """On SIGTERM the gateway drains, ends open streams with a last error event, cancels, exits 0."""
    run_dir = new_run_dir()
    scheduler = ScriptedScheduler(f"ipc://{run_dir}").start()
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 5000)
    gateway = GatewayProcess(f"ipc://{run_dir}", "--shutdown-timeout-s", "0.3")
    try:
        gateway.wait_healthy()
        response = requests.post(gateway.url + "/generate_stream", json={"inputs": "Hi"}, stream=True, timeout=10)
        assert response.status_code == 200, response.text
        events = iter_events(response)
        next(events)
        result: dict = {}
        reader = threading.Thread(target=lambda: result.setdefault("events", list(events)))
        reader.start()
        returncode, output = gateway.stop()
        reader.join(5)
        assert returncode == 0, output
        assert result["events"][-1] == {"error": "the gateway is shutting down", "error_type": "unhealthy"}
        generate = scheduler.messages(Generate)[-1]
        assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == generate.request_id
    finally:
        gateway.stop()
        scheduler.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
