"""The scheduler's metrics of record, as plain data: counters and histograms by label.

Nothing here imports prometheus_client. The scheduler answers a stats query with these
families (`MetricFamily` messages, inside `StatsReply`), and every gateway renders them next
to its own figures at `/metrics`. Names are TGI's where TGI has the metric (see
docs/metrics.md); durations are in seconds.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ztgi.common.messages import Generation, MetricFamily, MetricKind, MetricSample, Timings
from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.worker_slot import WorkerSlot

if TYPE_CHECKING:
    from ztgi.services.scheduler.paged_batcher import PagedStep

DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKENS_PER_STEP_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 12, 17)

Labels = tuple[tuple[str, str], ...]


@dataclasses.dataclass
class Histogram:
    """Observations counted per bucket (`value <= bound`; the last bucket is +Inf) and summed."""

    upper_bounds: tuple[float, ...]
    bucket_counts: list[int]
    total: float = 0.0

    @classmethod
    def empty(cls, upper_bounds: tuple[float, ...]) -> Histogram:
        return cls(upper_bounds, [0] * (len(upper_bounds) + 1))

    def observe(self, value: float) -> None:
        self.bucket_counts[bisect.bisect_left(self.upper_bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.bucket_counts)


class Family:
    """One metric: a value (counter) or a histogram per label set."""

    def __init__(self, name: str, kind: MetricKind, help_text: str, upper_bounds: tuple[float, ...] = ()) -> None:
        assert (kind == "histogram") == bool(upper_bounds), name
        self.name = name
        self.kind = kind
        self.help_text = help_text
        self.upper_bounds = upper_bounds
        self.values: dict[Labels, float] = {}
        self.histograms: dict[Labels, Histogram] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        histogram = self.histograms.get(key)
        if histogram is None:
            histogram = self.histograms[key] = Histogram.empty(self.upper_bounds)
        histogram.observe(value)

    def to_message(self) -> MetricFamily:
        samples = [MetricSample(dict(key), value) for key, value in self.values.items()]
        samples += [MetricSample(dict(key), h.total, list(h.bucket_counts)) for key, h in self.histograms.items()]
        return MetricFamily(self.name, self.kind, self.help_text, samples, list(self.upper_bounds))


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


class SchedulerMetrics:
    """What the scheduler alone can measure: worker commands, queueing and request phases.

    The batcher records each worker command (`method` is prefill or decode, TGI's label); the
    hub records each request's phases: validation (arrival to encoded), queue (encoded to
    prefill), inference (prefill to finish) and how requests end.
    """

    def __init__(self) -> None:
        def histogram(name: str, help_text: str, bounds: tuple[float, ...] = DURATION_BUCKETS_S) -> Family:
            return Family(name, "histogram", help_text, bounds)

        self.batch_inference_count = Family(
            "tgi_batch_inference_count", "counter", "Inference calls per method (prefill or decode)")
        self.batch_inference_success = Family(
            "tgi_batch_inference_success", "counter", "Successful inference calls per method (prefill or decode)")
        self.batch_inference_failure = Family(
            "tgi_batch_inference_failure", "counter", "Failed inference calls per method (prefill or decode)")
        self.batch_inference_duration = histogram(
            "tgi_batch_inference_duration", "Batch inference duration per method: a worker command's round trip")
        self.batch_forward_duration = histogram(
            "tgi_batch_forward_duration", "Batch forward duration per method (prefill or decode)")
        self.batch_decode_duration = histogram(
            "tgi_batch_decode_duration", "Time spent choosing tokens after the forward pass, per method")
        self.batch_concat_duration = histogram(
            "tgi_batch_concat_duration", "Time spent concatenating cached batches before a decode step")
        self.batch_filter_duration = histogram(
            "tgi_batch_filter_duration", "Filter command duration (finished requests leaving a batch)")
        self.batch_next_size = histogram("tgi_batch_next_size", "Size of each new prefill batch", BATCH_SIZE_BUCKETS)
        self.request_validation_duration = histogram(
            "tgi_request_validation_duration", "Request validation duration: arrival to tokenized")
        self.request_queue_duration = histogram(
            "tgi_request_queue_duration", "Request queue duration: tokenized to prefill")
        self.request_inference_duration = histogram(
            "tgi_request_inference_duration", "Request inference duration: prefill to the last token")
        self.request_mean_time_per_token_duration = histogram(
            "tgi_request_mean_time_per_token_duration", "Mean time per generated token, per request")
        self.request_failure = Family(
            "ztgi_scheduler_request_failure", "counter", "Requests the scheduler ended with an error, by error type")
        self.preemptions = Family(
            "ztgi_preemptions", "counter", "Requests preempted when a paged worker ran out of KV blocks (requeued)")
        self.requests_requeued = Family(
            "ztgi_requests_requeued", "counter",
            "Running requests sent back to the queue to resume on another worker from their prompt and tokens so "
            "far, by reason: their worker was lost (worker_lost), or it drained and could not finish them in its "
            "grace period (handed_back)")
        self.prefix_cache_queried_tokens = Family(
            "ztgi_prefix_cache_queried_tokens", "counter",
            "Input tokens of admitted requests looked up in a paged worker's prefix cache")
        self.prefix_cache_hit_tokens = Family(
            "ztgi_prefix_cache_hit_tokens", "counter",
            "Input tokens whose KV came from the prefix cache instead of being computed")
        self.placement_requests = Family(
            "ztgi_placement_requests", "counter",
            "Requests admitted on one of several paged workers, by outcome: on a holder of the longest prefix "
            "of its input (holder), not (not_holder), or no worker held any of it (no_holder)")
        self.speculative_proposed_tokens = Family(
            "ztgi_speculative_proposed_tokens", "counter", "Tokens proposed for verification (--speculate)")
        self.speculative_accepted_tokens = Family(
            "ztgi_speculative_accepted_tokens", "counter", "Proposed tokens accepted: each one a forward saved")
        self.request_tokens_per_step = histogram(
            "ztgi_request_tokens_per_step", "Tokens a decoding request got from one step (above 1: speculation)",
            TOKENS_PER_STEP_BUCKETS)
        self.prefill_chunks = Family(
            "ztgi_prefill_chunks", "counter", "Chunks of prompts prefilled over several steps (chunked prefill)")

    @property
    def families(self) -> list[Family]:
        return [value for value in vars(self).values() if isinstance(value, Family)]

    def to_messages(self, workers: Iterable[WorkerSlot] = ()) -> list[MetricFamily]:
        """Every family, plus gauges of the workers' current batches."""
        max_tokens = Family("tgi_batch_current_max_tokens", "gauge", "Maximum tokens of each worker's current batch")
        blocks = {state: Family(f"ztgi_kv_blocks_{state}", "gauge", f"KV blocks of each paged worker's pool: {state}")
                  for state in ("total", "used", "free", "cached")}
        evictions = Family("ztgi_prefix_cache_evictions", "counter",
                           "Cached KV blocks evicted (least recently used) to make room, per paged worker")
        hit_rate = Family("ztgi_prefix_cache_hit_rate", "gauge",
                          "Share of looked-up input tokens found in the prefix cache, since start")
        for worker in workers:
            name = worker.identity.decode(errors="replace")
            max_tokens.inc(float(worker.batch_max_tokens), worker=name)
            if worker.allocator is not None:
                allocator = worker.allocator
                blocks["total"].inc(float(allocator.num_blocks), worker=name)
                blocks["used"].inc(float(allocator.num_used), worker=name)
                blocks["free"].inc(float(allocator.num_free), worker=name)
                blocks["cached"].inc(float(allocator.num_cached), worker=name)
                evictions.inc(float(allocator.num_evictions), worker=name)
        queried = sum(self.prefix_cache_queried_tokens.values.values())
        hit_rate.inc(sum(self.prefix_cache_hit_tokens.values.values()) / queried if queried else 0.0)
        extra = [max_tokens, *blocks.values(), evictions, hit_rate]
        return [family.to_message() for family in [*self.families, *extra]]

    # -- worker commands -----------------------------------------------------------------------

    def record_step(self, method: str, duration_s: float, timings: Timings) -> None:
        """A Prefill or Decode answered with a StepResult."""
        self.batch_inference_count.inc(method=method)
        self.batch_inference_success.inc(method=method)
        self.batch_inference_duration.observe(duration_s, method=method)
        self.batch_forward_duration.observe(timings.forward_ns / 1e9, method=method)
        self.batch_decode_duration.observe(timings.decode_ns / 1e9, method=method)
        if method == "decode":
            self.batch_concat_duration.observe(timings.concatenate_ns / 1e9)
        if timings.num_proposed:
            self.speculative_proposed_tokens.inc(float(timings.num_proposed))
            self.speculative_accepted_tokens.inc(float(timings.num_accepted))

    def record_tokens_per_step(self, num_tokens: Iterable[int]) -> None:
        """How many tokens each decoding request of a paged step got."""
        for count in num_tokens:
            self.request_tokens_per_step.observe(float(count))

    def record_failed_step(self, method: str) -> None:
        self.batch_inference_count.inc(method=method)
        self.batch_inference_failure.inc(method=method)

    def record_chunks(self, step: PagedStep) -> None:
        """Counts the step's prefill chunks of prompts that take more than one step."""
        for request in [*step.running, *step.admitted]:
            chunk = step.chunks.get(request.seq_id)
            if chunk is not None and chunk < request.prefill_len:
                self.prefill_chunks.inc()

    def record_prefix_hits(self, admitted: list[Request]) -> None:
        """Newcomers of a paged step: the input tokens looked up, and those the cache held."""
        for request in admitted:
            self.prefix_cache_queried_tokens.inc(float(request.prefill_len))
            self.prefix_cache_hit_tokens.inc(float(request.num_computed))

    def record_placements(self, outcomes: Iterable[str]) -> None:
        """Where each newcomer of a step landed, against where its prefix was (`placement_outcome`)."""
        for outcome in outcomes:
            self.placement_requests.inc(outcome=outcome)

    def record_filter(self, duration_s: float) -> None:
        self.batch_filter_duration.observe(duration_s)

    def record_prefill(self, requests: list[Request], now: float) -> None:
        """A new prefill batch leaves the queue."""
        self.batch_next_size.observe(len(requests))
        for request in requests:
            self.request_queue_duration.observe(now - request.queued_at)

    # -- requests ------------------------------------------------------------------------------

    def record_encoded(self, request: Request, now: float) -> None:
        self.request_validation_duration.observe(now - request.created_at)

    def record_finished(self, request: Request, generation: Generation | None, now: float) -> None:
        """A request's last token: `generation` from the worker, None for a stop-sequence hit."""
        inference_s = now - request.prefill_started_at
        num_tokens = generation.generated_tokens if generation is not None else len(request.generated_ids)
        self.request_inference_duration.observe(inference_s)
        if num_tokens > 0:
            self.request_mean_time_per_token_duration.observe(inference_s / num_tokens)

    def record_failure(self, error_type: str, num_requests: int = 1) -> None:
        if num_requests:
            self.request_failure.inc(num_requests, err=error_type)
