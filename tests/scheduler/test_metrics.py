"""Scheduler metrics of record: histogram buckets, and what the scheduler records per command and request."""

from __future__ import annotations

from tests.scheduler.test_scheduler import CLIENT, WORKER_A, Harness
from ztgi.common import messages as m
from ztgi.common.codec import decode, encode
from ztgi.services.scheduler.metrics import Histogram


def families(h: Harness) -> dict[str, m.MetricFamily]:
    h.take("frontend")
    h.scheduler.on_client_frame(CLIENT, encode(m.Query("q", "stats")))
    (_, reply), = h.messages_to("frontend")
    assert isinstance(reply, m.StatsReply)
    return {family.name: family for family in reply.families}


def value(family: m.MetricFamily, **labels: str) -> float:
    return next(s.value for s in family.samples if s.labels == labels)


def count(family: m.MetricFamily, **labels: str) -> int:
    return sum(next(s.bucket_counts for s in family.samples if s.labels == labels))


def test_histogram_counts_each_value_in_its_le_bucket() -> None:
    """A value equal to a bound counts in that bucket; larger than every bound, in +Inf."""
    histogram = Histogram.empty((1.0, 2.0))
    for observed in (0.5, 1.0, 1.5, 3.0):
        histogram.observe(observed)
    assert histogram.bucket_counts == [2, 1, 1] and histogram.count == 4 and histogram.total == 6.0


def test_stats_carry_batch_and_request_figures_after_a_request() -> None:
    """Prefill, decode and finish show up as per-method batch counts and request-phase histograms."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [rid])
    (_, decode_cmd), = h.messages_to("workers")
    h.answer_step(WORKER_A, decode_cmd, prefill.batch.batch_id, [rid], finished={rid: "length"})
    found = families(h)
    assert value(found["tgi_batch_inference_count"], method="prefill") == 1
    assert value(found["tgi_batch_inference_success"], method="decode") == 1
    assert count(found["tgi_batch_inference_duration"], method="decode") == 1
    assert count(found["tgi_batch_forward_duration"], method="prefill") == 1
    assert count(found["tgi_batch_next_size"]) == 1
    for name in ("tgi_request_validation_duration", "tgi_request_queue_duration",
                 "tgi_request_inference_duration", "tgi_request_mean_time_per_token_duration"):
        assert count(found[name]) == 1, name
    assert value(found["tgi_batch_current_max_tokens"], worker=WORKER_A.decode()) == 100
    assert found["tgi_batch_inference_count"].kind == "counter" and found["tgi_batch_next_size"].kind == "histogram"


def test_failures_are_counted_by_error_type_and_method() -> None:
    """An overloaded admission and a failed prefill count as request failures and a failed inference."""
    h = Harness(max_concurrent_requests=1)
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("r2", "x", None, m.GenerateParameters())))
    (_, prefill), = h.step()
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandFailed(prefill.command_id, "boom", [])))
    found = families(h)
    assert value(found["ztgi_scheduler_request_failure"], err="overloaded") == 1
    assert value(found["ztgi_scheduler_request_failure"], err="generation") == 1
    assert value(found["tgi_batch_inference_failure"], method="prefill") == 1
    assert value(found["tgi_batch_inference_count"], method="prefill") == 1


def test_families_survive_the_wire() -> None:
    """The StatsReply with its families decodes back equal (msgpack, checked types)."""
    h = Harness()
    h.scheduler.on_client_frame(CLIENT, encode(m.Query("q", "stats")))
    (frames,) = h.take("frontend")
    reply = decode(frames[1])
    assert decode(encode(reply)) == reply and reply.families
