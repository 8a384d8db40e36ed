"""Every live request, by the worker's integer id and by the client's key."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from ztgi.common.messages import Generation, RequestKey
from ztgi.services.scheduler.request import Request


class RequestTable:
    """Live requests; a request leaves the table the moment it finishes, fails or is cancelled."""

    def __init__(self) -> None:
        self._by_id: dict[int, Request] = {}
        self._by_key: dict[RequestKey, Request] = {}
        self._next_id = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._by_id.values()))

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._by_id

    def create(self, key: RequestKey) -> Request:
        request = Request(seq_id=next(self._next_id), key=key)
        self._by_id[request.seq_id] = request
        self._by_key[key] = request
        return request

    def get(self, seq_id: int) -> Request | None:
        return self._by_id.get(seq_id)

    def by_key(self, key: RequestKey) -> Request | None:
        return self._by_key.get(key)

    def record(self, generation: Generation, worker_id: bytes) -> Request | None:
        """A step's token for a request running on `worker_id`: appended to its ids, and a request
        it finished leaves the table. None when the request is gone (finished, stopped or cancelled
        while the step ran) or runs elsewhere now: the token is stale."""
        request = self._by_id.get(generation.seq_id)
        if request is None or request.worker_id != worker_id:
            return None
        request.generated_ids.append(generation.token_id)
        if generation.finish_reason is not None:
            self.remove(request)
        return request

    def remove(self, request: Request) -> None:
        self._by_id.pop(request.seq_id, None)
        self._by_key.pop(request.key, None)

    def of_client(self, client_id: bytes) -> list[Request]:
        return [r for r in self._by_id.values() if r.key.client_id == client_id]
