"""The near-tie rule that greedy comparisons across kernels use (no server)."""

from __future__ import annotations

import pytest

from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy


def _stream(ids: list[int], top2: list[list[tuple[int, float]]]) -> GreedyStream:
    return GreedyStream(ids, [f"<{i}>" for i in ids], top2)


REFERENCE = _stream([5, 6, 7], [[(5, -0.1), (9, -3.0)], [(6, -0.7000), (8, -0.7004)], [(7, -0.2), (1, -2.0)]])


def test_equal_streams_agree() -> None:
    assert_same_greedy(REFERENCE, _stream([5, 6, 7], []))


def test_parting_at_a_near_tie_for_the_runner_up_agrees() -> None:
    assert_same_greedy(REFERENCE, _stream([5, 8, 2], []))


@pytest.mark.parametrize("ids, message", [([9, 6, 7], "gap"), ([5, 3, 7], "runner-up"), ([5, 6], "prefix")])
def test_other_differences_do_not(ids: list[int], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        assert_same_greedy(REFERENCE, _stream(ids, []))
