"""The batches a worker keeps between steps, by batch id."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Generic, TypeVar

B = TypeVar("B")

MAX_ENDED = 256


class BatchCache(Generic[B]):
    """Maps batch ids to cached batches (TGI's `Cache`), and remembers the last batches that
    ended: every request stopped, or a Filter kept none. The scheduler may have sent a Decode of
    such a batch ahead of the answer that ended it (pipelined decode); that Decode is answered
    with an empty step rather than failed."""

    def __init__(self) -> None:
        self._batches: dict[int, B] = {}
        self._ended: collections.OrderedDict[int, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._batches)

    def __contains__(self, batch_id: int) -> bool:
        return batch_id in self._batches

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._batches))

    def get(self, batch_id: int) -> B | None:
        return self._batches.get(batch_id)

    def set(self, batch_id: int, batch: B) -> None:
        self._batches[batch_id] = batch
        self._ended.pop(batch_id, None)  # an id in use again (a new scheduler numbers from 1) is live

    def pop(self, batch_id: int) -> B | None:
        return self._batches.pop(batch_id, None)

    def delete(self, batch_id: int) -> None:
        self._batches.pop(batch_id, None)

    def end(self, batch_id: int) -> None:
        """Deletes a batch that has nothing left to run, and remembers that it ended."""
        self._batches.pop(batch_id, None)
        self._ended[batch_id] = None
        if len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    def has_ended(self, batch_id: int) -> bool:
        return batch_id in self._ended

    def clear(self) -> None:
        self._batches.clear()
        self._ended.clear()
