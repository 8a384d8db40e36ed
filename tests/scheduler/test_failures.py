"""The scheduler under failures: a failed step, a lost only worker, and clients kept apart (no sockets)."""

from __future__ import annotations

from tests.scheduler.test_scheduler import CLIENT, INFO, WORKER_A, Harness
from ztgi.common import messages as m
from ztgi.common.codec import encode

OTHER_CLIENT = b"client-2"


def test_failed_decode_clears_the_worker_before_anything_else() -> None:
    """A failed Decode fails its batch's requests, then a tracked Clear runs before the next Prefill."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [rid])
    h.take("detokenize")
    (_, decode_cmd), = h.messages_to("workers")
    h.submit("r2")
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandFailed(decode_cmd.command_id, "RuntimeError: boom", [rid])))
    (_, error), = h.messages_to("frontend")
    assert error.events[0].request_id == "r1" and error.events[0].error_type == "generation"
    (_, clear), = h.step()
    assert isinstance(clear, m.Clear) and clear.batch_id is None
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandDone(clear.command_id)))
    (_, prefill2), = h.messages_to("workers")
    assert isinstance(prefill2, m.Prefill) and [r.seq_id for r in prefill2.batch.requests] == [rid + 1]
    assert h.messages_to("frontend") == []  # r2 is untouched


def test_failed_prefill_beside_a_running_batch_keeps_it() -> None:
    """A failed Prefill of newcomers fails only them; the running batch decodes on."""
    h = Harness(waiting_served_ratio=0.0)
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    first_id = prefill.batch.requests[0].seq_id
    h.submit("r2")
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [first_id])
    h.take("detokenize")
    (_, second), = h.messages_to("workers")
    assert isinstance(second, m.Prefill)
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandFailed(second.command_id, "too large", [])))
    (_, error), = h.messages_to("frontend")
    assert [e.request_id for e in error.events] == ["r2"]
    (_, decode_cmd), = h.messages_to("workers")
    assert isinstance(decode_cmd, m.Decode) and decode_cmd.batch_ids == [prefill.batch.batch_id]


def test_resumed_request_waits_no_worker_timeout_from_the_loss() -> None:
    """A running request whose only worker is lost waits no_worker_timeout_s from the loss, then fails."""
    h = Harness(no_worker_timeout_s=2.0)
    h.add_worker(WORKER_A)
    h.submit("r1")
    (_, prefill), = h.step()
    request = h.scheduler.table.get(prefill.batch.requests[0].seq_id)
    request.queued_at -= 100.0  # it was queued long ago
    h.scheduler.batcher.on_worker_lost(WORKER_A, "test")
    lost_at = request.queued_at
    h.scheduler.tick(lost_at + 1.0)
    assert h.messages_to("frontend") == [] and len(h.scheduler.queue) == 1
    h.scheduler.tick(lost_at + 2.5)
    (_, error), = h.messages_to("frontend")
    assert error.events[0].error_type == "unhealthy" and "No worker" in error.events[0].error
    assert len(h.scheduler.table) == 0 and len(h.scheduler.queue) == 0


def test_a_client_cannot_cancel_another_clients_request() -> None:
    """Cancel with another client's request_id touches nothing: requests are keyed by client identity."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.scheduler.on_client_frame(OTHER_CLIENT, encode(m.Cancel("r1")))
    assert len(h.scheduler.queue) == 1 and h.messages_to("detokenize") == []
    (_, prefill), = h.step()
    request = h.scheduler.table.by_key(m.RequestKey(CLIENT, "r1"))
    assert [r.seq_id for r in prefill.batch.requests] == [request.seq_id]


def test_same_request_id_from_two_clients_are_two_requests() -> None:
    """Two clients may use the same request_id; each gets only its own events."""
    h = Harness()
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("r1", "x", None, m.GenerateParameters())))
    h.scheduler.on_client_frame(OTHER_CLIENT, encode(m.Generate("r1", "y", None, m.GenerateParameters())))
    assert len(h.scheduler.table) == 2 and h.messages_to("frontend") == []
    h.scheduler.on_tokenized_frame(encode(m.Rejected(m.RequestKey(OTHER_CLIENT, "r1"), "too long")))
    (client, reply), = h.messages_to("frontend")
    assert client == OTHER_CLIENT and reply.events[0].error == "too long"
    assert h.scheduler.table.by_key(m.RequestKey(CLIENT, "r1")) is not None


def test_requests_sent_while_workers_start_wait_the_startup_grace() -> None:
    """Before any worker is ready, and while one is registered and warming up, a queued request
    waits startup_grace_s, not no_worker_timeout_s, and runs once the worker is ready (before: it
    failed with 503 "No worker is available" at no_worker_timeout_s, a second before the worker
    came up). After the grace it fails with the same reason."""
    h = Harness(no_worker_timeout_s=2.0, startup_grace_s=60.0, heartbeat_interval_ms=60_000)
    start = h.scheduler.started_at
    h.submit("early")
    h.scheduler.tick(start + 30.0)  # no worker yet: it loads its model
    boot_nonce = "nonce-of-worker-a"
    h.scheduler.on_worker_frame(WORKER_A, encode(m.Hello("worker", m.PROTOCOL_VERSION, boot_nonce, INFO)))
    (_, warmup), = h.messages_to("workers")
    h.scheduler.tick(start + 59.0)  # registered, warming up
    assert h.messages_to("frontend") == [] and len(h.scheduler.queue) == 1
    h.scheduler.on_worker_frame(WORKER_A, encode(m.WarmupResult(warmup.command_id, 10_000)))
    (_, prefill), = h.step()
    assert isinstance(prefill, m.Prefill) and len(prefill.batch.requests) == 1

    late = Harness(no_worker_timeout_s=2.0, startup_grace_s=60.0, heartbeat_interval_ms=60_000)
    late.submit("never")
    late.scheduler.tick(late.scheduler.started_at + 30.0)
    assert late.messages_to("frontend") == []
    late.scheduler.tick(late.scheduler.started_at + 61.0)
    (_, error), = late.messages_to("frontend")
    assert error.events[0].error_type == "unhealthy" and "No worker" in error.events[0].error
