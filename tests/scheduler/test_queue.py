"""RequestQueue.next_batch: TGI's padded budget rule."""

from __future__ import annotations

from ztgi.common.messages import Encoded, RequestKey, SamplingParameters
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus


def make_request(seq_id: int, input_length: int, max_new_tokens: int) -> Request:
    key = RequestKey(b"c", str(seq_id))
    encoded = Encoded(key, list(range(input_length)), SamplingParameters(), max_new_tokens, False, 0, False, b"t")
    return Request(seq_id, key, RequestStatus.QUEUED, encoded)


def make_queue(*shapes: tuple[int, int]) -> RequestQueue:
    queue = RequestQueue()
    for i, (input_length, max_new_tokens) in enumerate(shapes, start=1):
        queue.append(make_request(i, input_length, max_new_tokens))
    return queue


def test_takes_all_that_fit() -> None:
    """Everything is taken when budgets allow; the budget counts padding to the longest input."""
    queue = make_queue((10, 5), (20, 5), (5, 5))
    requests, max_tokens = queue.next_batch(None, None, 1000, 1000)
    assert [r.seq_id for r in requests] == [1, 2, 3]
    assert max_tokens == 3 * 20 + 15
    assert len(queue) == 0


def test_prefill_budget_counts_padding() -> None:
    """The prefill budget stops the batch where (n + 1) x longest input would exceed it."""
    queue = make_queue((10, 5), (30, 5), (5, 5))
    requests, _ = queue.next_batch(None, None, 59, 1000)
    assert [r.seq_id for r in requests] == [1]
    assert len(queue) == 2


def test_total_budget() -> None:
    """Prefill plus new tokens must fit the token budget."""
    queue = make_queue((10, 100), (10, 100))
    requests, _ = queue.next_batch(None, None, 1000, 150)
    assert [r.seq_id for r in requests] == [1]


def test_min_size_puts_back() -> None:
    """Fewer than min_size requests: nothing is taken and the queue is untouched."""
    queue = make_queue((10, 5))
    assert queue.next_batch(2, None, 1000, 1000) is None
    assert len(queue) == 1


def test_max_size() -> None:
    """max_size caps the batch."""
    queue = make_queue((1, 1), (1, 1), (1, 1))
    requests, _ = queue.next_batch(None, 2, 1000, 1000)
    assert len(requests) == 2 and len(queue) == 1


def test_nothing_fits() -> None:
    """A first request over budget yields None and stays queued (FIFO is not reordered)."""
    queue = make_queue((100, 5), (1, 1))
    assert queue.next_batch(None, None, 50, 1000) is None
    assert len(queue) == 2
