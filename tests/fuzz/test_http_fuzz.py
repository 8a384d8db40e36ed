"""Hostile HTTP requests to every route: never a 5xx, never a crash, always the API's error shape.

TGI routes answer `{"error": str, "error_type": str}`; `/v1` routes answer OpenAI's
`{"error": {"message": str, "type": str, ...}}`. One test runs against a gateway over the scripted
scheduler (fast, many cases), one against a gateway over the real pipeline (tiny model, fewer
cases). The number of cases each ran is printed (run with `-s` to see it).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any
from urllib.parse import quote

import pytest
import requests
from hypothesis import given, settings

from tests.fuzz.bodies import request
from tests.fuzz.fuzz_settings import FUZZ, SCALE
from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler, default_script
from ztgi.common.messages import Generate

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # large failing cases
NUM_SCRIPTED_CASES = 400 * SCALE
NUM_REAL_CASES = 80 * SCALE
SCRIPTED_UNKNOWN = ("/tokenize",)  # a query the scripted scheduler does not answer (the real one does)


def short_script(generate: Generate) -> list:
    """The default script, never longer than 3 tokens whatever max_new_tokens says."""
    max_new_tokens = min(generate.parameters.max_new_tokens or 3, 3)
    return default_script(dataclasses.replace(
        generate, parameters=dataclasses.replace(generate.parameters, max_new_tokens=max_new_tokens)))


def check_answer(session: requests.Session, base_url: str, case: dict[str, Any]) -> int:
    url = base_url + quote(case["path"], safe="/%") + ("?" + quote(case["query"], safe="=&") if case["query"] else "")
    response = session.request(case["method"], url, data=case["body"], headers=case["headers"], timeout=60)
    body = response.content  # a stream is read to its end
    assert response.status_code < 500, (case, response.status_code, body[:500])
    if response.status_code < 400 or case["method"] == "OPTIONS":
        return response.status_code
    error = response.json()
    if case["path"].startswith("/v1/"):
        assert isinstance(error.get("error"), dict), (case, error)
        assert isinstance(error["error"].get("message"), str) and isinstance(error["error"].get("type"), str), error
    else:
        assert isinstance(error.get("error"), str) and isinstance(error.get("error_type"), str), (case, error)
    return response.status_code


def fuzz(base_url: str, num_cases: int, excluded: tuple[str, ...] = ()) -> collections.Counter:
    """Sends `num_cases` hostile requests; how many got each status."""
    statuses: collections.Counter = collections.Counter()
    with requests.Session() as session:
        @settings(max_examples=num_cases, **FUZZ)
        @given(case=request(excluded))
        def send(case: dict[str, Any]) -> None:
            statuses[check_answer(session, base_url, case)] += 1

        send()
    return statuses


def test_hostile_requests_to_a_gateway_over_the_scripted_scheduler(
        scripted_gateway: tuple[GatewayProcess, ScriptedScheduler]) -> None:
    """Every route, method, content type and hostile body: a 2xx/4xx in the API's shape; the gateway lives."""
    gateway, scheduler = scripted_gateway
    scheduler.script = short_script
    statuses = fuzz(gateway.url, NUM_SCRIPTED_CASES, excluded=SCRIPTED_UNKNOWN)
    assert gateway.process.poll() is None, gateway.output()
    assert requests.post(gateway.url + "/generate", json={"inputs": "Hi"}, timeout=10).status_code == 200
    print(f"\n[fuzz] HTTP, scripted scheduler: {statuses.total()} cases, by status {dict(sorted(statuses.items()))}")


def test_hostile_requests_to_a_gateway_over_the_real_pipeline(real_gateway: GatewayProcess, pipeline) -> None:
    """The same against the real pipeline on the tiny model; then a valid request still succeeds."""
    pipe, _ = pipeline
    statuses = fuzz(real_gateway.url, NUM_REAL_CASES)
    response = requests.post(real_gateway.url + "/generate",
                             json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}}, timeout=60)
    assert response.status_code == 200, response.text
    assert real_gateway.process.poll() is None and pipe.all_alive(), pipe.logs()
    print(f"\n[fuzz] HTTP, real pipeline: {statuses.total()} cases, by status {dict(sorted(statuses.items()))}")
