"""Blocks a request no longer needs on a worker whose every layer attends within a sliding window.

Such a model's query at position p reads keys from p - window + 1 on, and positions only grow, so
a block whose positions all lie before the next step's first position minus the window is never
read again: the scheduler frees it for other requests while the request runs on. The worker is not
told: its block table keeps the freed ids in place (positions stay where they were), its attention
never gathers them for a decode, and masks them for a prefill chunk.
"""

from __future__ import annotations

from ztgi.services.scheduler.block_allocator import BlockAllocator
from ztgi.services.scheduler.request import Request


def blocks_behind_window(next_position: int, window: int, block_size: int) -> int:
    """How many of a request's first blocks no step from `next_position` on reads."""
    return max(0, next_position - window + 1) // block_size


def free_blocks_behind_window(request: Request, allocator: BlockAllocator, window: int) -> None:
    """Frees the request's blocks that fell behind the window since the last call."""
    num_behind = blocks_behind_window(request.num_computed, window, allocator.block_size)
    if num_behind > request.num_dropped_blocks:
        allocator.free(request.block_ids[request.num_dropped_blocks:num_behind])
        request.num_dropped_blocks = num_behind
