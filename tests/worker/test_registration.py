"""When the worker registers again, from the scheduler's answers to its heartbeats."""

from __future__ import annotations

from ztgi.services.worker.registration import Registration, Rejoin


def test_known_worker_stays_registered() -> None:
    """Answers that know the worker (or say nothing) never ask for a Hello."""
    registration = Registration()
    assert [registration.on_heartbeat("s1", known) for known in (True, None, True)] == [None, None, None]


def test_new_scheduler_nonce_asks_for_hello_at_once() -> None:
    """A restarted scheduler (new nonce) asks for a Hello on its first answer, and not again
    before `retry_after` more answers."""
    registration = Registration(patience=2, retry_after=3)
    registration.on_heartbeat("s1", True)
    assert registration.on_heartbeat("s2", False) is Rejoin.SCHEDULER_RESTARTED
    # the new scheduler has not seen the Hello yet (a long command before it): no second ask at once
    assert [registration.on_heartbeat("s2", False) for _ in range(3)] == [None, None, Rejoin.UNKNOWN_TO_SCHEDULER]
    assert registration.on_heartbeat("s2", True) is None


def test_dropped_worker_asks_after_patience_then_retries_later() -> None:
    """One 'unknown' answer may have overtaken the Hello: the second in a row asks for a Hello,
    and while no answer knows the worker, it asks again every `retry_after` answers."""
    registration = Registration(patience=2, retry_after=3)
    answers = [registration.on_heartbeat("s1", False) for _ in range(8)]
    unknown = Rejoin.UNKNOWN_TO_SCHEDULER
    assert answers == [None, unknown, None, None, unknown, None, None, unknown]


def test_a_known_answer_resets_the_count() -> None:
    """An answer that knows the worker in between starts the count again."""
    registration = Registration(patience=2)
    assert [registration.on_heartbeat("s1", known) for known in (False, True, False)] == [None, None, None]
