"""Freeing the blocks behind a sliding window: which, when, and only once."""

from __future__ import annotations

import pytest

from ztgi.common.messages import RequestKey
from ztgi.services.scheduler.block_allocator import BlockAllocator
from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.sliding_window import blocks_behind_window, free_blocks_behind_window


@pytest.mark.parametrize("next_position, expected", [(0, 0), (8, 0), (10, 0), (11, 1), (14, 1), (15, 2), (40, 8)])
def test_blocks_behind_a_window_of_8_with_blocks_of_4(next_position: int, expected: int) -> None:
    """Position p reads keys p - 7 .. p: block b (positions 4b .. 4b + 3) is done once 4b + 3 < p - 7."""
    assert blocks_behind_window(next_position, 8, 4) == expected


def test_freed_blocks_go_back_to_the_pool_once() -> None:
    allocator = BlockAllocator(16, 4)
    request = Request(1, RequestKey(b"client", "r1"))
    request.block_ids = allocator.allocate(6)
    first_blocks = request.block_ids[:2]
    request.num_computed = 15
    free_blocks_behind_window(request, allocator, 8)
    assert request.num_dropped_blocks == 2 and allocator.num_free == 12
    free_blocks_behind_window(request, allocator, 8)  # nothing more fell behind: nothing freed twice
    assert allocator.num_free == 12
    assert set(first_blocks) <= set(allocator.allocate(12))
