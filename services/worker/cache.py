"""The batches a worker keeps between steps, by batch id."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

B = TypeVar("B")


class BatchCache(Generic[B]):
    """Maps batch ids to cached batches (TGI's `Cache`)."""

    def __init__(self) -> None:
        self._batches: dict[int, B] = {}

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

    def pop(self, batch_id: int) -> B | None:
        return self._batches.pop(batch_id, None)

    def delete(self, batch_id: int) -> None:
        self._batches.pop(batch_id, None)

    def clear(self) -> None:
        self._batches.clear()
