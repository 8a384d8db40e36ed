"""When the worker registers again, from the scheduler's answers to its heartbeats."""

from __future__ import annotations

from ztgi.services.worker.registration import Registration, Rejoin

UNKNOWN = Rejoin.UNKNOWN_TO_SCHEDULER


def test_known_worker_stays_registered() -> None:
    """Answers that know the worker (or say nothing) never ask for a Hello."""
    registration = Registration(retry_after_s=2.0)
    assert [registration.on_heartbeat("s1", known, t) for t, known in enumerate((True, None, True))] == [None] * 3


def test_new_scheduler_nonce_asks_for_hello_at_once() -> None:
    """A restarted scheduler (new nonce) asks for a Hello on its first answer, and not again
    before `retry_after_s` has passed."""
    registration = Registration(retry_after_s=2.0)
    registration.on_heartbeat("s1", True, 0.0)
    assert registration.on_heartbeat("s2", False, 1.0) is Rejoin.SCHEDULER_RESTARTED
    # the new scheduler has not seen the Hello yet (a long command before it): no second ask at once
    assert [registration.on_heartbeat("s2", False, t) for t in (1.5, 2.0, 2.5, 3.0)] == [None, None, None, UNKNOWN]
    assert registration.on_heartbeat("s2", True, 3.5) is None


def test_dropped_worker_asks_after_patience_then_retries_later() -> None:
    """One 'unknown' answer may have overtaken the Hello: the second in a row asks for a Hello,
    and while no answer knows the worker, it asks again every `retry_after_s`."""
    registration = Registration(retry_after_s=1.5, patience=2)
    answers = [registration.on_heartbeat("s1", False, t / 2) for t in range(8)]
    assert answers == [None, UNKNOWN, None, None, UNKNOWN, None, None, UNKNOWN]


def test_a_known_answer_resets_the_count() -> None:
    """An answer that knows the worker in between starts the count again."""
    registration = Registration(retry_after_s=2.0, patience=2)
    assert [registration.on_heartbeat("s1", known, t) for t, known in enumerate((False, True, False))] == [None] * 3


def test_heartbeats_answered_at_once_after_a_cut_ask_for_one_hello() -> None:
    """A link back after a cut: the 30 heartbeats queued behind it are answered in a burst, each
    with 'unknown'. One Hello is asked for, not one per `retry_after` answers (each Hello would
    cost a registration and a warmup); a dropped worker's next drop asks again at once."""
    registration = Registration(retry_after_s=2.0)
    registration.on_heartbeat("s1", True, 0.0)
    burst = [registration.on_heartbeat("s1", False, 10.0 + i * 1e-4) for i in range(30)]
    assert burst.count(UNKNOWN) == 1
    assert registration.on_heartbeat("s1", True, 10.2) is None  # the Hello got through
    assert [registration.on_heartbeat("s1", False, t) for t in (10.4, 10.6)] == [None, UNKNOWN]
