"""`GET /metrics`: Prometheus text with this gateway's request figures and the scheduler's.

Each app keeps its own `CollectorRegistry` (never the global one: tests run several apps in one
process). The gateway records what it sees of every generation stream through the client's
`observe` hook (`RequestTimer`), and requests its own validation refused through
`rejection_middleware`. At scrape time it asks the scheduler for a `StatsReply` and renders it
with `SchedulerCollector`: the scheduler's counters, gauges and histograms of record.

Names are TGI's where TGI has the metric; prometheus_client writes counters with the
`_total` suffix (`tgi_request_count_total`). The full list is in docs/metrics.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ztgi.common.client.errors import ZtgiError
from ztgi.common.messages import GenerateParameters, MetricFamily, StatsReply, StreamEvent
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.errors import HttpError
from ztgi.services.gateway.state import CLIENT

logger = logging.getLogger(__name__)

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
GENERATION_PATHS = frozenset({"/", "/generate", "/generate_stream", "/invocations", "/v1/chat/completions",
                              "/v1/completions", "/v1/responses", "/v1/messages"})


class GatewayMetrics:
    """This gateway's registry: request counters and histograms, plus the scheduler collector."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.request_count = Counter("tgi_request_count", "Generation requests received", registry=registry)
        self.request_success = Counter("tgi_request_success", "Generation requests that finished well",
                                       registry=registry)
        self.request_failure = Counter("tgi_request_failure", "Generation requests that failed, by error type",
                                       ["err"], registry=registry)
        self.request_duration = Histogram("tgi_request_duration", "End-to-end request duration seen by the gateway",
                                          buckets=DURATION_BUCKETS_S, registry=registry)
        self.request_generated_tokens = Histogram("tgi_request_generated_tokens", "Generated tokens per request",
                                                  buckets=TOKEN_BUCKETS, registry=registry)
        self.request_input_length = Histogram("tgi_request_input_length", "Input tokens per request",
                                              buckets=TOKEN_BUCKETS, registry=registry)
        self.request_max_new_tokens = Histogram("tgi_request_max_new_tokens", "max_new_tokens asked per request",
                                                buckets=TOKEN_BUCKETS, registry=registry)
        self.time_to_first_token = Histogram(
            "ztgi_time_to_first_token_seconds", "Time from a request's arrival at the gateway to its first token",
            buckets=DURATION_BUCKETS_S, registry=registry)
        self.inter_token_latency = Histogram(
            "ztgi_inter_token_latency_seconds", "Time between consecutive tokens of a request",
            buckets=LATENCY_BUCKETS_S, registry=registry)
        self.scheduler = SchedulerCollector()
        registry.register(self.scheduler)

    def observe(self, parameters: GenerateParameters) -> RequestTimer:
        """The client's `observe` hook: a timer for one generation stream."""
        return RequestTimer(self, parameters)

    def on_rejected(self, error_type: str) -> None:
        """A generation request the gateway refused before it reached the pipeline."""
        self.request_count.inc()
        self.request_failure.labels(err=error_type).inc()

    def render(self, stats: StatsReply | None) -> bytes:
        """Prometheus text; `stats` None when the scheduler did not answer (ztgi_scheduler_up 0)."""
        self.scheduler.stats = stats  # no await until rendered: concurrent scrapes can't mix
        try:
            return generate_latest(self.registry)
        finally:
            self.scheduler.stats = None


class RequestTimer:
    """Records one generation stream: TTFT, inter-token gaps, and how and when it ended."""

    def __init__(self, metrics: GatewayMetrics, parameters: GenerateParameters) -> None:
        self.metrics = metrics
        self.started = time.monotonic()
        self.last_token_at: float | None = None
        metrics.request_count.inc()
        if parameters.max_new_tokens is not None:
            metrics.request_max_new_tokens.observe(parameters.max_new_tokens)

    def on_event(self, event: StreamEvent) -> None:
        now = time.monotonic()
        metrics = self.metrics
        if event.token is not None:
            if self.last_token_at is None:
                metrics.time_to_first_token.observe(now - self.started)
            else:
                metrics.inter_token_latency.observe(now - self.last_token_at)
            self.last_token_at = now
        if event.error is not None:
            metrics.request_failure.labels(err=event.error_type or "generation").inc()
        elif event.is_final:
            metrics.request_success.inc()
            metrics.request_duration.observe(now - self.started)
            if event.details is not None:
                metrics.request_generated_tokens.observe(event.details.generated_tokens)
                metrics.request_input_length.observe(event.details.input_tokens)

    def on_close(self, finished: bool) -> None:
        if not finished:  # the HTTP client left, or the request was abandoned
            self.metrics.request_failure.labels(err="cancelled").inc()


class SchedulerCollector:
    """Renders the scheduler's StatsReply of the current scrape (set by `GatewayMetrics.render`)."""

    def __init__(self) -> None:
        self.stats: StatsReply | None = None

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        yield GaugeMetricFamily("ztgi_scheduler_up", "Whether the scheduler answered this scrape",
                                value=0 if stats is None else 1)
        if stats is None:
            return
        yield GaugeMetricFamily("tgi_queue_size", "Requests waiting in the scheduler's queue", value=stats.num_queued)
        yield GaugeMetricFamily("ztgi_requests_running", "Requests in a worker's batch", value=stats.num_running)
        yield GaugeMetricFamily("ztgi_workers", "Workers ready", value=stats.num_workers)
        yield GaugeMetricFamily("ztgi_tokenizers", "Tokenizers connected", value=stats.num_tokenizers)
        yield _by_worker(GaugeMetricFamily("tgi_batch_current_size", "Current batch size per worker",
                                           labels=["worker"]), stats.worker_batch_sizes)
        yield _by_worker(CounterMetricFamily("ztgi_worker_requests_served", "Requests prefilled per worker",
                                             labels=["worker"]), stats.worker_requests_served)
        yield CounterMetricFamily("ztgi_generated_tokens", "Tokens generated by the workers",
                                  value=stats.num_generated_tokens)
        yield CounterMetricFamily("ztgi_requests_finished", "Requests that reached their last token",
                                  value=stats.num_requests_finished)
        for family in stats.families:
            yield render_family(family)


def _by_worker(family: GaugeMetricFamily | CounterMetricFamily, values: dict[str, int]) -> Metric:
    for worker, value in sorted(values.items()):
        family.add_metric([worker], value)
    return family


def render_family(family: MetricFamily) -> Metric:
    """A scheduler `MetricFamily` as the matching prometheus_client family."""
    label_names = sorted({name for sample in family.samples for name in sample.labels})
    if family.kind == "histogram":
        histogram = HistogramMetricFamily(family.name, family.help, labels=label_names)
        bounds = [*(repr(float(bound)) for bound in family.upper_bounds), "+Inf"]
        for sample in family.samples:
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, sample.bucket_counts):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric(_label_values(sample.labels, label_names), buckets, sample.value)
        return histogram
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    rendered = kind(family.name, family.help, labels=label_names)
    for sample in family.samples:
        rendered.add_metric(_label_values(sample.labels, label_names), sample.value)
    return rendered


def _label_values(labels: dict[str, str], names: list[str]) -> list[str]:
    return [labels.get(name, "") for name in names]


METRICS = web.AppKey("metrics", GatewayMetrics)


async def handle_metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text; this gateway's figures even when the scheduler is away."""
    try:
        stats = await request.app[CLIENT].stats()
    except (ZtgiError, TimeoutError) as exc:
        logger.warning("/metrics without the scheduler's figures: %s", exc)
        stats = None
    return web.Response(body=request.app[METRICS].render(stats), headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def rejection_middleware(request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Counts generation requests refused by the gateway itself (bad body, too large)."""
    try:
        return await handler(request)
    except ValidationError:
        if request.path in GENERATION_PATHS:
            request.app[METRICS].on_rejected("validation")
        raise
    except HttpError as exc:
        if request.path in GENERATION_PATHS:
            request.app[METRICS].on_rejected(exc.error_type)
        raise
