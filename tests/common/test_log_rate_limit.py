"""RateLimitFilter: a repeated warning is written `burst` times per interval, then counted."""

from __future__ import annotations

import logging

import pytest

from ztgi.common.log_rate_limit import RateLimitFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited() -> tuple[logging.Logger, RateLimitFilter, Clock, list[str]]:
    clock = Clock()
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    limit = RateLimitFilter(10.0, burst=3, clock=clock)
    handler.addFilter(limit)
    logger = logging.getLogger("test.rate_limit")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, limit, clock, lines
    logger.handlers.clear()


def test_a_flood_is_counted_after_the_burst(limited) -> None:
    """1,000 warnings of one template: three lines, then one that counts the other 997."""
    logger, limit, clock, lines = limited
    for i in range(1000):
        logger.warning("bad frame %d", i)
    clock.now = 10.0
    limit.flush()
    assert lines == ["bad frame 0", "bad frame 1", "bad frame 2",
                     "997 more like 'bad frame %d' suppressed in the last 10 s"]


def test_templates_info_and_new_intervals_are_apart(limited) -> None:
    """Each template has its own budget, INFO is never held back, a new interval starts afresh
    (and first reports what the last one suppressed)."""
    logger, _, clock, lines = limited
    for _ in range(4):
        logger.warning("a")
        logger.warning("b")
        logger.info("i")
    clock.now = 11.0
    logger.warning("a")
    assert lines.count("a") == 4 and lines.count("b") == 3 and lines.count("i") == 4
    assert "1 more like 'a' suppressed in the last 11 s" in lines
