"""Health that tells the truth: progress, the one-token canary and its failures (no sockets)."""

from __future__ import annotations

from tests.scheduler.test_scheduler import CLIENT, INFO, TOKENIZER, WORKER_A, Harness
from ztgi.common import messages as m
from ztgi.common.codec import encode


def health(h: Harness, query_id: str = "q") -> list[m.HealthReply]:
    h.scheduler.on_client_frame(CLIENT, encode(m.Query(query_id, "health")))
    return [reply for _, reply in h.messages_to("frontend")]


def quiet(h: Harness, worker: bytes, seconds: float) -> None:
    """Makes the worker's last answer `seconds` older than it is."""
    h.scheduler.batcher.workers[worker].last_progress -= seconds


def test_warming_worker_is_not_ready() -> None:
    """A worker that said Hello but has not finished warmup gives 503 'no worker is ready'."""
    h = Harness()
    h.scheduler.on_worker_frame(WORKER_A, encode(m.Hello("worker", m.PROTOCOL_VERSION, "w", INFO)))
    assert health(h) == [m.HealthReply("q", False, "no worker is ready (1 warming up)")]


def test_recent_progress_is_healthy_without_a_canary() -> None:
    """A worker that answered a command within health_window_s is healthy; nothing is sent to it."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.take("workers")
    assert health(h) == [m.HealthReply("q", True, "ok")]
    assert h.take("workers") == []


def test_quiet_worker_gets_a_canary_and_health_waits_for_it() -> None:
    """After health_window_s of quiet, health sends one one-token Prefill and answers when it returns."""
    h = Harness(health_window_s=5.0)
    h.add_worker(WORKER_A)
    h.take("workers")
    quiet(h, WORKER_A, 10.0)
    assert health(h, "q1") == [] and health(h, "q2") == []  # both wait; one canary only
    (_, canary), = h.messages_to("workers")
    assert isinstance(canary, m.Prefill) and canary.batch.requests[0].max_new_tokens == 1
    h.scheduler.on_worker_frame(WORKER_A, encode(m.StepResult(
        canary.command_id, [m.Generation(0, 5, -1.0, "length", 1)], None, m.Timings())))
    replies = [reply for _, reply in h.messages_to("frontend")]
    assert replies == [m.HealthReply("q1", True, "ok"), m.HealthReply("q2", True, "ok")]
    assert h.messages_to("detokenize") == []  # the canary's token goes to no one
    assert health(h, "q3") == [m.HealthReply("q3", True, "ok")]  # the canary counts as progress


def test_failed_canary_is_unhealthy_with_the_workers_error() -> None:
    """A canary answered with CommandFailed gives 503 naming the worker's error; the worker stays."""
    h = Harness(health_window_s=5.0)
    h.add_worker(WORKER_A)
    h.take("workers")
    quiet(h, WORKER_A, 10.0)
    health(h)
    (_, canary), = h.messages_to("workers")
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandFailed(canary.command_id, "CUDA error", [0])))
    (reply,) = [reply for _, reply in h.messages_to("frontend")]
    assert not reply.healthy and "CUDA error" in reply.reason and "canary" in reply.reason
    h.submit("r1")
    (_, prefill), = h.step()
    assert isinstance(prefill, m.Prefill)


def test_canary_that_never_returns_times_out() -> None:
    """A canary not back within canary_timeout_s answers 503; the worker is busy, so health says stuck."""
    h = Harness(health_window_s=5.0, canary_timeout_s=2.0)
    h.add_worker(WORKER_A)
    h.take("workers")
    quiet(h, WORKER_A, 10.0)
    health(h)
    (_, canary), = h.messages_to("workers")
    h.scheduler.tick(h.scheduler.health_monitor.canary.sent_at + 3.0)
    (reply,) = [reply for _, reply in h.messages_to("frontend")]
    assert not reply.healthy and "did not finish a one-token canary in 2 s" in reply.reason
    (again,) = health(h)
    assert not again.healthy and "stuck" in again.reason
    assert h.take("workers") == []


def test_busy_worker_without_progress_is_stuck() -> None:
    """A worker whose command has run longer than health_window_s is unhealthy, no canary sent."""
    h = Harness(health_window_s=5.0)
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.step()
    quiet(h, WORKER_A, 10.0)
    h.scheduler.batcher.workers[WORKER_A].in_flight[0].sent_at -= 10.0
    (reply,) = health(h)
    assert not reply.healthy and "no worker has answered its command for 10 s" in reply.reason
    assert h.take("workers") == []


def test_stuck_reason_counts_from_the_unanswered_command() -> None:
    """A worker idle for 40 s that then stops answering (a frozen process) is said to be stuck
    for as long as its command waited, not for the 40 s it had nothing to do."""
    h = Harness(health_window_s=30.0, canary_timeout_s=3.0)
    h.add_worker(WORKER_A)
    h.take("workers")
    quiet(h, WORKER_A, 40.0)
    health(h)  # a canary goes out; the frozen worker will not answer it
    sent_at = h.scheduler.health_monitor.canary.sent_at
    h.scheduler.tick(sent_at + 3.5)
    h.take("frontend")
    reason = h.scheduler.assess_health(sent_at + 4.0).reason
    assert reason.startswith("no worker has answered its command for 4 s") and "40" not in reason, reason


def test_lost_worker_is_named_in_the_reason() -> None:
    """With the only worker lost, 503 says which and why (here: its connection closed)."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.scheduler.on_worker_disconnected(WORKER_A)
    (reply,) = health(h)
    assert reply.reason == "no worker is ready; worker worker-a was lost 0 s ago (disconnected)"


def test_canary_worker_lost_answers_unhealthy() -> None:
    """If the canary's worker is lost, the waiting health queries get 503 at the next tick."""
    h = Harness(health_window_s=5.0)
    h.add_worker(WORKER_A)
    h.take("workers")
    quiet(h, WORKER_A, 10.0)
    health(h)
    h.scheduler.batcher.on_worker_lost(WORKER_A, "test")
    h.scheduler.tick(h.scheduler.health_monitor.canary.sent_at)
    (reply,) = [reply for _, reply in h.messages_to("frontend")]
    assert not reply.healthy and "lost during a one-token canary" in reply.reason


def test_no_tokenizer_and_draining_are_unhealthy() -> None:
    """Without a tokenizer, or while draining, health is 503 with that reason."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)
    h.add_worker(WORKER_A)
    h.scheduler.tokenizers.last_seen[TOKENIZER] -= 10.0
    h.scheduler.tick(h.scheduler.batcher.workers[WORKER_A].last_seen)
    assert health(h) == [m.HealthReply("q", False, "no tokenizer is connected")]
    h.scheduler.draining = True
    assert health(h) == [m.HealthReply("q", False, "shutting down")]
