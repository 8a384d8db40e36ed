"""A worker told to stop drains: nothing new reaches it, its requests finish there or, when they
could not in its grace period and another worker serves, resume there at once (no sockets)."""

from __future__ import annotations

from tests.scheduler.test_scheduler import WORKER_A, WORKER_B, Harness
from ztgi.common import messages as m
from ztgi.common.codec import encode


def heartbeat(h: Harness, worker: bytes, drain_s_left: float | None) -> m.Heartbeat:
    """The worker's liveness socket heartbeats (another identity, known by its boot nonce); the answer."""
    liveness = worker + b"/liveness"
    h.scheduler.on_worker_frame(liveness, encode(m.Heartbeat(f"nonce-of-{worker.decode()}",
                                                             drain_s_left=drain_s_left)))
    answers = [msg for to, msg in h.messages_to("workers") if to == liveness]
    assert len(answers) == 1 and isinstance(answers[0], m.Heartbeat)
    return answers[0]


def health(h: Harness) -> m.HealthReply:
    h.scheduler.on_client_frame(b"client-1", encode(m.Query("q", "health")))
    (_, reply), = h.messages_to("frontend")
    return reply


def test_draining_worker_finishes_its_request_takes_no_new_one_then_is_drained() -> None:
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    first = prefill.batch.requests[0].seq_id
    assert heartbeat(h, WORKER_A, 30.0).drained is False
    h.submit("r2")
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [first])
    h.take("detokenize")
    (_, decode_cmd), = h.messages_to("workers")
    assert isinstance(decode_cmd, m.Decode) and decode_cmd.batch_ids == [prefill.batch.batch_id]
    assert [r.seq_id for r in h.scheduler.queue] == [first + 1]  # r2 waits for a worker that serves
    assert health(h).healthy is False and "1 draining to stop" in health(h).reason
    h.answer_step(WORKER_A, decode_cmd, prefill.batch.batch_id, [first], finished={first: "length"})
    (_, filter_cmd), = h.messages_to("workers")
    assert heartbeat(h, WORKER_A, 29.0).drained is False  # the Filter of r1 is on its way
    assert isinstance(filter_cmd, m.Filter) and filter_cmd.seq_ids == []
    h.scheduler.on_worker_frame(WORKER_A, encode(m.FilterResult(filter_cmd.command_id, None)))
    assert h.step() == []  # nothing for a draining worker, r2 still waits
    assert heartbeat(h, WORKER_A, 28.0).drained is True
    h.scheduler.on_worker_disconnected(WORKER_A)
    assert h.scheduler.batcher.metrics.requests_requeued.to_message().samples == []


def test_requests_that_cannot_finish_in_time_move_to_a_serving_worker_at_once() -> None:
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=100)
    (_, prefill), = h.step()
    seq_id = prefill.batch.requests[0].seq_id
    h.add_worker(WORKER_B)
    heartbeat(h, WORKER_A, 0.5)  # less than the margin: nothing can finish
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [seq_id])
    h.take("detokenize")
    (worker, filter_cmd), = h.messages_to("workers")
    assert worker == WORKER_A and isinstance(filter_cmd, m.Filter) and filter_cmd.seq_ids == []
    (worker, resumed), = h.step()  # the scheduler's loop moves every worker on after each message
    assert worker == WORKER_B
    assert isinstance(resumed, m.Prefill) and resumed.batch.requests[0].seq_id == seq_id
    assert resumed.batch.requests[0].input_ids == [10, 11, 12, 13, 14, 7]  # the prompt and its token so far
    samples = h.scheduler.batcher.metrics.requests_requeued.to_message().samples
    assert [(s.labels, s.value) for s in samples] == [({"reason": "handed_back"}, 1.0)]


def test_with_no_other_worker_a_late_request_stays_where_it_runs() -> None:
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=100)
    (_, prefill), = h.step()
    seq_id = prefill.batch.requests[0].seq_id
    heartbeat(h, WORKER_A, 0.5)
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [seq_id])
    h.take("detokenize")
    (_, decode_cmd), = h.messages_to("workers")
    assert isinstance(decode_cmd, m.Decode)  # it may still end early (EOS); at the deadline the worker exits


def test_an_idle_worker_is_drained_at_once_and_the_other_keeps_serving() -> None:
    h = Harness()
    h.add_worker(WORKER_A)
    h.add_worker(WORKER_B)
    h.take("workers")
    assert heartbeat(h, WORKER_A, 30.0).drained is True
    assert health(h).healthy is True
    for i in range(2):
        h.submit(f"r{i}")
    assert [worker for worker, _ in h.step()] == [WORKER_B]
