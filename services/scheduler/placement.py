"""Cache-aware placement of queued requests over data-parallel paged workers (SGLang's router).

A request belongs to the worker holding the longest prefix of its input, counted in whole
blocks: cached in that worker's prefix cache, or being computed there by a request it runs now
(so the second request of a burst sharing a document follows the first one, before the first
one's blocks are even full). Another worker takes it anyway when the holder is much busier (it
runs at least twice as many requests, and `MIN_IMBALANCE` more). A request no worker holds any
of goes to the least busy worker.

`--placement round-robin` picks `RoundRobinPlacement` instead (round_robin_placement.py); both
are a `PlacementPolicy`, and `placement_outcome` says of either's choice whether the request
landed on a holder of its prefix (the `ztgi_placement_requests` metric).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.worker_slot import WorkerSlot

CACHE_AWARE, ROUND_ROBIN = "cache-aware", "round-robin"
PLACEMENTS = (CACHE_AWARE, ROUND_ROBIN)
MIN_IMBALANCE = 4  # a holder this many requests busier (and twice as busy) loses a request to another
MAX_LOOKAHEAD = 64  # queued requests a worker looks through for ones placed on it

Outcome = Literal["holder", "not_holder", "no_holder"]


class PlacementPolicy:
    """For one worker's admission, over the ready paged workers (and the requests each runs):
    which queued requests are this worker's. A policy says whose each request is (`owner`)."""

    def __init__(self, slot: WorkerSlot, slots: list[WorkerSlot], running: dict[bytes, list[Request]],
                 max_loras: int = 0) -> None:
        self.slot = slot
        self.slots = slots
        self.running = running
        self.max_loras = max_loras
        self.adapters = {s.identity: {r.adapter.name for r in running.get(s.identity, ()) if r.adapter is not None}
                         for s in slots}
        self.loads = {s.identity: len(running.get(s.identity, ())) for s in slots}
        self._matches: dict[int, dict[bytes, int]] = {}  # seq_id -> worker -> blocks of its prefix held

    def matches(self, request: Request) -> dict[bytes, int]:
        """Whole blocks of the request's prefix each worker holds, counted once per admission."""
        matches = self._matches.get(request.seq_id)
        if matches is None:
            matches = self._matches[request.seq_id] = {
                s.identity: num_matched_blocks(s, request, self.running) for s in self.slots}
        return matches

    def candidates(self, queue: Iterable[Request]) -> Iterator[Request]:
        """The queued requests this worker may take, in queue order; each one yielded is counted
        as taken (the caller takes it or stops)."""
        for index, request in enumerate(queue):
            if index >= MAX_LOOKAHEAD:
                return
            if self.owner(request) is self.slot:
                self.loads[self.slot.identity] += 1
                yield request

    def owner(self, request: Request) -> WorkerSlot:
        raise NotImplementedError

    def may_take(self, slot: WorkerSlot, request: Request) -> bool:
        """Whether `slot` may run the request's LoRA adapter now: it runs it already, or fewer
        than --max-loras others."""
        if request.adapter is None or not self.max_loras:
            return True
        running = self.adapters[slot.identity]
        return request.adapter.name in running or len(running) < self.max_loras


class Placement(PlacementPolicy):
    """Cache-aware: the holder of the longest prefix, unless much busier."""

    def owner(self, request: Request) -> WorkerSlot:
        """The worker that should run `request` now."""
        matches = self.matches(request)
        load = self.loads
        slots = [s for s in self.slots if self.may_take(s, request)] or self.slots
        least_busy = min(slots, key=lambda s: (load[s.identity], s is not self.slot))
        holder = max(slots, key=lambda s: (matches[s.identity], -load[s.identity], s is self.slot))
        if matches[holder.identity] == 0 or self._much_busier(load[holder.identity], load[least_busy.identity]):
            return least_busy
        return holder

    @staticmethod
    def _much_busier(load: int, other: int) -> bool:
        return load >= 2 * other + MIN_IMBALANCE


def placement_outcome(request: Request, chosen: WorkerSlot, policy: PlacementPolicy) -> Outcome:
    """Whether `chosen` holds as many whole blocks of the request's prefix as any worker (as the
    policy saw them before this step): `no_holder` when none holds any."""
    matches = policy.matches(request)
    best = max(matches.values(), default=0)
    if best == 0:
        return "no_holder"
    return "holder" if matches.get(chosen.identity, 0) == best else "not_holder"


def num_matched_blocks(slot: WorkerSlot, request: Request, running: dict[bytes, list[Request]]) -> int:
    """Whole blocks of the request's tokens the worker holds (under its adapter): cached, or in a
    request of the same adapter it runs now."""
    allocator = slot.allocator
    assert allocator is not None
    tokens, salt = request.cache_tokens, request.cache_salt
    best = len(allocator.match(tokens, salt))
    size = allocator.block_size
    for other in running.get(slot.identity, ()):
        if other.cache_salt == salt:
            best = max(best, _common_blocks(tokens, other.cache_tokens, size, best))
    return best


def _common_blocks(tokens: list[int], other: list[int], size: int, at_least: int) -> int:
    """Whole blocks the two token lists share from the start (0 unless more than `at_least`)."""
    limit = min(len(tokens) - 1, len(other)) // size
    if limit <= at_least or tokens[:(at_least + 1) * size] != other[:(at_least + 1) * size]:
        return 0
    count = at_least + 1
    while count < limit and tokens[count * size:(count + 1) * size] == other[count * size:(count + 1) * size]:
        count += 1
    return count
