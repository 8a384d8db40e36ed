"""Round-robin placement over data-parallel paged workers (`--placement round-robin`): the baseline
cache-aware placement is measured against, and a choice for traffic that shares nothing.

Requests take turns by arrival: the one with `seq_id` s belongs to ready worker s mod n, whatever
the workers cache. The worker list is the ready paged workers in registration order, so when one
dies (or registers again and warms up anew) the turns are dealt over the others at once and its
requeued requests resume there. A request whose turn falls on a worker with no room for it now
(too few free KV blocks for its input, or a full batch) goes to the least busy worker that has
room, so a full or stuck worker never holds a request back while another could run it.
"""

from __future__ import annotations

from ztgi.services.scheduler.placement import PlacementPolicy
from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.worker_slot import WorkerSlot


class RoundRobinPlacement(PlacementPolicy):
    """Each request's turn by its arrival, unless that worker has no room for it now."""

    def __init__(self, slot: WorkerSlot, slots: list[WorkerSlot], running: dict[bytes, list[Request]],
                 max_batch_size: int | None = None) -> None:
        super().__init__(slot, slots, running)
        self.max_batch_size = max_batch_size

    def owner(self, request: Request) -> WorkerSlot:
        """The worker whose turn `request` is, unless that one has no room for it now."""
        turn = self.slots[request.seq_id % len(self.slots)]
        if self._has_room(turn, request):
            return turn
        with_room = [s for s in self.slots if self._has_room(s, request)]
        return min(with_room, key=lambda s: (self.loads[s.identity], s is not self.slot), default=turn)

    def _has_room(self, slot: WorkerSlot, request: Request) -> bool:
        allocator = slot.allocator
        assert allocator is not None, "a paged worker"
        if self.max_batch_size is not None and self.loads[slot.identity] >= self.max_batch_size:
            return False
        return allocator.blocks_for(request.input_length) <= allocator.num_free
