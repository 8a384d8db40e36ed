"""One paged worker's KV blocks, as the scheduler hands them out (TGI v3's block allocator).

With prefix caching, full blocks stay indexed by their tokens (`PrefixCache`) while requests
hold them and after they leave: a newcomer takes the longest cached prefix of its input
(`match` then `acquire`) and prefills only the rest. A block nobody holds any more is still
counted free: `allocate` evicts such blocks, least recently used first, only when the plain
free list runs out.
"""

from __future__ import annotations

import collections

from ztgi.services.scheduler.prefix_cache import PrefixCache


class BlockAllocator:
    """Free block ids of one worker's pool; a request holds its blocks until it leaves the worker."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs blocks and a block size, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: collections.deque[int] = collections.deque(range(num_blocks))
        self.cache = PrefixCache(block_size) if prefix_caching else None
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks a request may get now: never used, or cached with no holder (evicted on demand)."""
        return len(self._free) + (self.cache.num_unreferenced if self.cache is not None else 0)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self.cache.block_to_node) if self.cache is not None else 0

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks no one holds, or None (nothing taken) when fewer are free."""
        if count > self.num_free:
            return None
        blocks = [self._free.popleft() for _ in range(min(count, len(self._free)))]
        while len(blocks) < count:
            assert self.cache is not None
            block_id = self.cache.evict()
            assert block_id is not None, "num_free counted a block that cannot be evicted"
            self.num_evictions += 1
            blocks.append(block_id)
        return blocks

    def free(self, block_ids: list[int]) -> None:
        """The holder is done with these blocks: cached ones lose a reference, others are free."""
        for block_id in block_ids:
            if self.cache is not None and block_id in self.cache:
                self.cache.release(block_id)
            else:
                self._free.append(block_id)

    # -- prefix caching ------------------------------------------------------------------------

    def match(self, tokens: list[int], salt: int = 0) -> list[int]:
        """Cached blocks holding the longest prefix of `tokens` (computed under `salt`: the
        request's adapter), leaving at least the last token to compute (its logits choose the next
        token). Not yet referenced: `acquire` them."""
        if self.cache is None or len(tokens) < 2:
            return []
        return self.cache.match(tokens, (len(tokens) - 1) // self.block_size, salt)

    def num_unheld(self, block_ids: list[int]) -> int:
        """How many of these cached blocks no request holds (they count as free until acquired)."""
        if not block_ids:
            return 0
        assert self.cache is not None, "cached blocks without a prefix cache"
        return sum(1 for b in block_ids if self.cache.block_to_node[b].num_refs == 0)

    def acquire(self, block_ids: list[int]) -> None:
        if block_ids:
            assert self.cache is not None
            self.cache.acquire(block_ids)

    def index(self, tokens: list[int], block_ids: list[int], num_computed: int, salt: int = 0) -> None:
        """A request's blocks filled up to `num_computed` of `tokens`: its full ones become cached.
        The partial last block is never indexed (it is still being written)."""
        if self.cache is not None:
            self.cache.insert(tokens, block_ids, min(num_computed // self.block_size, len(block_ids)), salt)
