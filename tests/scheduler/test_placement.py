"""Placement over two paged workers through the scheduler, with worker peers that check every
reused block and answer from the blocks' content: round-robin (`--placement round-robin`) against
cache-aware, a dead worker and a full worker under round-robin."""

from __future__ import annotations

import random

from tests.scheduler.test_prefix_caching import DOCUMENT, Harness, expected_tokens

OTHER_DOCUMENT = [90 - t for t in DOCUMENT]


def placement_counts(harness: Harness) -> dict[str, float]:
    family = harness.scheduler.metrics.placement_requests
    return {dict(labels)["outcome"]: value for labels, value in family.values.items()}


def computed_tokens(harness: Harness) -> float:
    """Input tokens the workers computed instead of taking them from their caches."""
    metrics = harness.scheduler.metrics
    queried = sum(metrics.prefix_cache_queried_tokens.values.values())
    return queried - sum(metrics.prefix_cache_hit_tokens.values.values())


def run_two_documents(placement: str, order: list[int]) -> Harness:
    """Requests on the two documents in `order`, one submitted per scheduling step."""
    harness = Harness(num_workers=2, num_blocks=300, placement=placement)
    documents = [DOCUMENT, OTHER_DOCUMENT]
    for i, d in enumerate(order):
        harness.submit(f"d{d}-{i}", documents[d] + [5 + i], 3)
        harness.step()
    harness.run()
    for i, d in enumerate(order):
        assert harness.tokens[f"d{d}-{i}"] == expected_tokens(documents[d] + [5 + i], 3)
    return harness


def test_round_robin_alternates_whatever_the_workers_cache() -> None:
    """One shared document, requests one after the other: round-robin deals them to the two
    workers in turn (so both compute the document), where cache-aware keeps them on its holder."""
    for placement in ("round-robin", "cache-aware"):
        harness = Harness(num_workers=2, num_blocks=300, placement=placement)
        for i in range(12):
            harness.submit(f"q{i}", DOCUMENT + [5 + i], 3)
            harness.run()
        assert all(harness.tokens[f"q{i}"] == expected_tokens(DOCUMENT + [5 + i], 3) for i in range(12))
        order = [harness.placed[f"q{i}"] for i in range(12)]
        if placement == "round-robin":
            assert all(a != b for a, b in zip(order, order[1:])), order
            assert placement_counts(harness)["not_holder"] == 1  # the second request: the first one's worker held it
        else:
            assert len(set(order)) == 1 and placement_counts(harness)["holder"] == 11


def test_cache_aware_puts_90_percent_on_the_holder_and_computes_less_than_round_robin() -> None:
    """Two documents in a random order over two workers: cache-aware places 90%+ of the requests
    on the worker holding their document (the placement metric and the workers' answers agree),
    and its workers compute fewer input tokens than round-robin's, which spreads both documents
    over both workers."""
    rng = random.Random(18)
    order = [rng.randrange(2) for _ in range(40)]
    aware, round_robin = run_two_documents("cache-aware", order), run_two_documents("round-robin", order)
    counts = placement_counts(aware)
    assert counts["holder"] >= 0.9 * (counts["holder"] + counts.get("not_holder", 0))
    first = {d: aware.placed[f"d{d}-{order.index(d)}"] for d in (0, 1)}
    on_holder = sum(aware.placed[f"d{d}-{i}"] == first[d] for i, d in enumerate(order))
    assert first[0] != first[1] and on_holder >= 0.9 * len(order)
    assert computed_tokens(aware) < computed_tokens(round_robin)
    assert placement_counts(round_robin).get("not_holder", 0) > counts.get("not_holder", 0)


def test_a_dead_worker_under_round_robin_loses_nothing() -> None:
    """Worker 1 dies with requests running and its turns still coming: its requests resume on
    worker 0, every later one goes there, and every answer is the uncached one."""
    harness = Harness(num_workers=2, num_blocks=300, placement="round-robin")
    prompts = {f"r{i}": DOCUMENT[:20 + i] for i in range(16)}
    for rid, prompt in list(prompts.items())[:8]:
        harness.submit(rid, prompt, 12)
    for _ in range(3):
        harness.step()
    assert {harness.placed[rid] for rid in list(prompts)[:8]} == {b"worker-0", b"worker-1"}
    harness.kill(b"worker-1")
    for rid, prompt in list(prompts.items())[8:]:
        harness.submit(rid, prompt, 12)
    harness.run()
    assert harness.tokens == {rid: expected_tokens(prompt, 12) for rid, prompt in prompts.items()}
    assert all(harness.placements[rid][-1] == b"worker-0" for rid in prompts)
    assert len(harness.scheduler.table) == 0 and not harness.scheduler.queue


def test_a_full_worker_under_round_robin_does_not_hold_its_turns_back() -> None:
    """Worker 0's pool holds one request at a time: requests whose turn is worker 0 while it is
    full go to worker 1 instead of waiting for it."""
    harness = Harness(num_blocks=[12, 300], placement="round-robin")
    prompts = {f"r{i}": DOCUMENT[i:i + 30] for i in range(10)}
    for rid, prompt in prompts.items():
        harness.submit(rid, prompt, 10)
    harness.run()
    assert harness.tokens == {rid: expected_tokens(prompt, 10) for rid, prompt in prompts.items()}
    on_worker_0 = [rid for rid in prompts if harness.placed[rid] == b"worker-0"]
    assert 1 <= len(on_worker_0) < 5  # its turns were five of the ten
    assert harness.peers[b"worker-0"].max_running == 1
