"""The worker's stop signal: a drain while it serves, an immediate exit otherwise or at a second signal."""

from __future__ import annotations

import threading

import pytest

from ztgi.services.worker.drain import Drain


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def serving_drain(timeout_s: float = 30.0) -> tuple[Drain, Clock]:
    clock = Clock()
    drain = Drain(timeout_s, threading.Event(), clock)
    drain.serving = lambda: True
    return drain, clock


def test_a_serving_worker_drains_at_the_first_signal_and_stops_at_the_second() -> None:
    drain, clock = serving_drain()
    drain.request()
    assert drain.draining and not drain.stop_requested.is_set()
    clock.now += 10
    assert drain.seconds_left() == 20.0
    drain.request()
    assert drain.stop_requested.is_set() and not drain.draining


@pytest.mark.parametrize("timeout_s, serving", [(0.0, True), (30.0, False)])
def test_without_a_grace_period_or_anything_served_the_worker_stops_at_once(timeout_s: float, serving: bool) -> None:
    drain = Drain(timeout_s, threading.Event())
    drain.serving = lambda: serving
    drain.request()
    assert drain.stop_requested.is_set() and drain.seconds_left() is None


@pytest.mark.parametrize("drained, connected, silent_s, elapsed_s, stops", [
    (False, True, 0.5, 10.0, False),  # requests still run, the scheduler answers
    (True, True, 0.5, 10.0, True),  # the scheduler says nothing runs here
    (False, False, 0.5, 10.0, True),  # the scheduler is gone
    (False, True, 3.5, 10.0, True),  # or silent for more than three heartbeats
    (False, True, 0.5, 30.0, True),  # the grace period is over
])
def test_the_drain_ends_when_drained_or_when_waiting_longer_is_pointless(
        drained: bool, connected: bool, silent_s: float, elapsed_s: float, stops: bool) -> None:
    drain, clock = serving_drain()
    drain.request()
    clock.now += elapsed_s
    drain.check(drained, connected, silent_s, heartbeat_interval_s=1.0)
    assert drain.stop_requested.is_set() is stops


def test_a_worker_that_does_not_drain_ignores_the_checks() -> None:
    drain, _ = serving_drain()
    drain.check(True, False, 100.0, heartbeat_interval_s=1.0)
    assert not drain.stop_requested.is_set() and drain.seconds_left() is None
