"""The FIFO of encoded requests and TGI's rule for cutting the next batch from it."""

from __future__ import annotations

import collections
from collections.abc import Iterator

from ztgi.services.scheduler.request import Request


class RequestQueue:
    """Requests waiting for a batch, oldest first (resumed requests go to the front)."""

    def __init__(self) -> None:
        self._requests: collections.deque[Request] = collections.deque()

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def append(self, request: Request) -> None:
        self._requests.append(request)

    def appendleft(self, request: Request) -> None:
        self._requests.appendleft(request)

    def remove(self, request: Request) -> None:
        self._requests.remove(request)

    def peek(self) -> Request:
        return self._requests[0]

    def popleft(self) -> Request:
        return self._requests.popleft()

    def next_batch(self, min_size: int | None, max_size: int | None,
                   prefill_token_budget: int, token_budget: int) -> tuple[list[Request], int] | None:
        """Takes the longest prefix of the queue that fits, as TGI's padded-model queue does.

        A padded batch costs `(n + 1) * max_input_length` prefill tokens as it grows (the next
        request could be the longest), plus every request's new tokens. Returns the requests and
        the batch's token budget, or None when nothing fits or fewer than `min_size` would.
        """
        taken: list[Request] = []
        max_input_length = 0
        decode_tokens = 0
        for request in self._requests:
            if max_size is not None and len(taken) >= max_size:
                break
            candidate_max_input = max(max_input_length, request.input_length)
            prefill_tokens = (len(taken) + 1) * candidate_max_input
            candidate_decode = decode_tokens + request.remaining_new_tokens
            if prefill_tokens > prefill_token_budget or prefill_tokens + candidate_decode > token_budget:
                break
            taken.append(request)
            max_input_length, decode_tokens = candidate_max_input, candidate_decode
        if not taken or (min_size is not None and len(taken) < min_size):
            return None
        for _ in taken:
            self._requests.popleft()
        return taken, len(taken) * max_input_length + decode_tokens
