"""One paged worker's KV blocks, as the scheduler hands them out (TGI v3's block allocator)."""

from __future__ import annotations

import collections


class BlockAllocator:
    """Free block ids of one worker's pool; a request holds its blocks until it leaves the worker."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs blocks and a block size, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: collections.deque[int] = collections.deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate(self, count: int) -> list[int] | None:
        """`count` free blocks, or None (nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.popleft() for _ in range(count)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)
