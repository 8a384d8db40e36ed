"""GET /metrics: Prometheus text with the gateway's request figures and the scheduler's, parsed
back with prometheus_client's own parser; plus /tokenize's gateway-side validation."""

from __future__ import annotations

import asyncio

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps
from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import StatsReply, Timings
from ztgi.services.gateway.metrics import GatewayMetrics
from ztgi.services.scheduler.metrics import SchedulerMetrics

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """Every sample as {(sample name, labels): value}, through prometheus_client's parser."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(gateway: GatewayProcess) -> Samples:
    response = requests.get(gateway.url + "/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    return parse(response.text)


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return get(after, name, **labels) - get(before, name, **labels)


def test_counters_and_histograms_move_after_a_request(gateway: GatewayProcess) -> None:
    """One /generate of 3 tokens: count, success, duration, TTFT, 2 inter-token gaps, lengths."""
    before = scrape(gateway)
    response = requests.post(gateway.url + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
                             timeout=10)
    assert response.status_code == 200
    after = scrape(gateway)
    assert moved(before, after, "tgi_request_count_total") == 1
    assert moved(before, after, "tgi_request_success_total") == 1
    assert moved(before, after, "tgi_request_duration_count") == 1
    assert moved(before, after, "ztgi_time_to_first_token_seconds_count") == 1
    assert moved(before, after, "ztgi_inter_token_latency_seconds_count") == 2
    assert moved(before, after, "tgi_request_generated_tokens_sum") == 3
    assert moved(before, after, "tgi_request_input_length_sum") == 2  # the scripted scheduler's input_tokens
    assert moved(before, after, "tgi_request_max_new_tokens_sum") == 3
    assert moved(before, after, "ztgi_time_to_first_token_seconds_bucket", le="+Inf") == 1


def test_failures_are_counted_by_error_type(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A scheduler error and a body the gateway refuses count as failures with TGI's error types."""
    before = scrape(gateway)
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    assert requests.post(gateway.url + "/generate", json={"inputs": "Hi"}, timeout=10).status_code == 429
    assert requests.post(gateway.url + "/generate_stream", json={"inputs": ""}, timeout=10).status_code == 422
    after = scrape(gateway)
    assert moved(before, after, "tgi_request_count_total") == 2
    assert moved(before, after, "tgi_request_failure_total", err="overloaded") == 1
    assert moved(before, after, "tgi_request_failure_total", err="validation") == 1
    assert moved(before, after, "tgi_request_success_total") == 0


def test_scheduler_figures_are_rendered(gateway: GatewayProcess) -> None:
    """The scheduler's StatsReply appears: queue size, per-worker batch size, peers, up."""
    samples = scrape(gateway)
    assert get(samples, "ztgi_scheduler_up") == 1
    assert ("tgi_queue_size", frozenset()) in samples
    assert ("tgi_batch_current_size", frozenset({("worker", "w0")})) in samples
    assert get(samples, "ztgi_workers") == 1 and get(samples, "ztgi_tokenizers") == 2


def test_scheduler_families_render_as_prometheus_histograms_and_counters() -> None:
    """MetricFamily records become cumulative buckets, _count/_sum, and labelled counters."""
    recorded = SchedulerMetrics()
    recorded.record_step("prefill", 0.2, Timings(forward_ns=150_000_000, decode_ns=1_000_000))
    recorded.record_step("decode", 0.02, Timings(forward_ns=10_000_000))
    recorded.record_step("decode", 3.0, Timings(forward_ns=10_000_000))
    stats = StatsReply("q", 4, 2, 1, 1, {"w": 2}, {"w": 6}, 42, 5, recorded.to_messages())
    samples = parse(GatewayMetrics().render(stats).decode())
    assert get(samples, "tgi_batch_inference_count_total", method="decode") == 2
    assert get(samples, "tgi_batch_inference_duration_count", method="decode") == 2
    assert get(samples, "tgi_batch_inference_duration_sum", method="decode") == 3.02
    assert get(samples, "tgi_batch_inference_duration_bucket", method="decode", le="0.025") == 1
    assert get(samples, "tgi_batch_inference_duration_bucket", method="decode", le="+Inf") == 2
    assert get(samples, "tgi_batch_forward_duration_sum", method="prefill") == 0.15
    assert get(samples, "tgi_queue_size") == 4 and get(samples, "ztgi_generated_tokens_total") == 42


def test_metrics_without_the_scheduler_still_render_the_gateway() -> None:
    """No StatsReply (scheduler away): the gateway's own families and ztgi_scheduler_up 0."""
    samples = parse(GatewayMetrics().render(None).decode())
    assert get(samples, "ztgi_scheduler_up") == 0 and ("tgi_request_count_total", frozenset()) in samples
    assert ("tgi_queue_size", frozenset()) not in samples


def test_tokenize_refuses_empty_inputs_with_tgi_error(gateway: GatewayProcess, schemas: dict) -> None:
    """POST /tokenize with empty inputs is a 422 in TGI's error shape, never sent on."""
    response = requests.post(gateway.url + "/tokenize", json={"inputs": ""}, timeout=10)
    assert response.status_code == 422 and response.json()["error_type"] == "validation"
    validate(response.json(), "ErrorResponse", schemas)


def test_a_request_that_never_reaches_the_scheduler_counts_as_failed(tmp_path) -> None:
    """With no scheduler, the client's unhealthy error still reaches the gateway's failure counter."""
    metrics = GatewayMetrics()

    async def body() -> None:
        client = AsyncZtgiClient(f"ipc://{tmp_path}", heartbeat_interval_ms=20, heartbeat_misses=2)
        client.observe = metrics.observe
        try:
            with pytest.raises(ZtgiError):
                await client.generate("Hi")
        finally:
            await client.aclose()

    asyncio.run(body())
    samples = parse(metrics.render(None).decode())
    assert get(samples, "tgi_request_count_total") == 1
    assert get(samples, "tgi_request_failure_total", err="unhealthy") == 1
