"""The near-tie rule by which two greedy streams may part."""

from __future__ import annotations

from ztgi.bench.greedy_parity import GreedyStream, greedy_difference


def stream(ids: list[int], top2: list[list[tuple[int, float]]] | None = None) -> GreedyStream:
    return GreedyStream(ids, [f"<{i}>" for i in ids], top2 or [])


def test_parting_at_a_near_tie_is_allowed_in_either_listed_order():
    """An exact tie may come out of topk in either order: the stream that took the other of the two
    still parts at a tie, and a token outside the two, or a gap wider than the tolerance, does not."""
    reference_ids = [5, 7, 9]
    for top in ([(7, -0.5), (8, -0.5)], [(8, -0.5), (7, -0.5)]):
        reference = stream(reference_ids, [[(5, -0.1), (6, -3.0)], top, [(9, -0.1), (1, -4.0)]])
        assert greedy_difference(reference, stream([5, 8, 1]), tolerance=0.01) is None
        assert "not the runner-up" in greedy_difference(reference, stream([5, 4, 1]), tolerance=0.01)
    wide = stream(reference_ids, [[(5, -0.1), (6, -3.0)], [(7, -0.2), (8, -0.9)], [(9, -0.1), (1, -4.0)]])
    assert "gap" in greedy_difference(wide, stream([5, 8, 1]), tolerance=0.01)
    assert greedy_difference(wide, stream(reference_ids)) is None
