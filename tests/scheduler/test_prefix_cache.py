"""The block allocator's prefix cache alone: matches by tokens, reference counts, LRU eviction
only under pressure, and partial blocks never shared."""

from __future__ import annotations

import pytest

from ztgi.services.scheduler.block_allocator import BlockAllocator

SIZE = 4


def _written(allocator: BlockAllocator, tokens: list[int]) -> list[int]:
    """A request that got fresh blocks for `tokens`, computed them all and had them indexed."""
    block_ids = allocator.allocate(allocator.blocks_for(len(tokens)))
    assert block_ids is not None
    allocator.index(tokens, block_ids, len(tokens))
    return block_ids


def test_a_newcomer_matches_the_longest_cached_prefix_in_whole_blocks() -> None:
    """Full blocks of a request are found by a newcomer sharing its first tokens, block by block."""
    allocator = BlockAllocator(16, SIZE, prefix_caching=True)
    blocks = _written(allocator, list(range(10)))  # two full blocks and a partial one
    assert allocator.match(list(range(10)) + [99]) == blocks[:2]
    assert allocator.match(list(range(6)) + [50, 51, 52]) == blocks[:1]
    assert allocator.match([1, 0, 2, 3, 4, 5]) == []


def test_matches_compare_tokens_and_leave_the_last_token_to_compute() -> None:
    """A prompt equal to the cached blocks still computes its last token; other tokens never match."""
    allocator = BlockAllocator(16, SIZE, prefix_caching=True)
    blocks = _written(allocator, list(range(8)))
    assert allocator.match(list(range(8))) == blocks[:1]  # 8 tokens: at most 7 cached, so one block
    assert allocator.match(list(range(4)) + [4, 5, 6, 8, 0]) == blocks[:1]


def test_the_partial_last_block_is_never_shared() -> None:
    """A request's block that is still being written (not full) is not indexed."""
    allocator = BlockAllocator(16, SIZE, prefix_caching=True)
    block_ids = allocator.allocate(2)
    allocator.index(list(range(8)), block_ids, 6)  # 6 of 8 tokens computed: one full block
    assert allocator.match(list(range(8)) + [1]) == block_ids[:1] and allocator.num_cached == 1


def test_referenced_blocks_are_never_evicted_and_unreferenced_ones_only_under_pressure() -> None:
    """Freed cached blocks stay cached while the free list lasts, then go least recently used first."""
    allocator = BlockAllocator(6, SIZE, prefix_caching=True)
    first = _written(allocator, list(range(8)))        # 2 blocks
    second = _written(allocator, list(range(100, 108)))  # 2 blocks
    allocator.free(first)
    allocator.free(second)
    assert allocator.num_free == 6 and allocator.num_cached == 4
    assert allocator.allocate(2) is not None and allocator.num_evictions == 0  # the two never used
    allocator.acquire(allocator.match(list(range(100, 109))))  # `second` is held again, and recent
    taken = allocator.allocate(2)
    assert sorted(taken) == sorted(first) and allocator.num_evictions == 2
    assert allocator.match(list(range(9))) == [] and allocator.match(list(range(100, 109))) == second
    assert allocator.allocate(1) is None  # the held blocks are not free


def test_reference_counts_follow_every_holder() -> None:
    """Two holders of a cached block: it stays held until both let go."""
    allocator = BlockAllocator(4, SIZE, prefix_caching=True)
    blocks = _written(allocator, list(range(5)))  # one full block (cached) and one partial
    hit = allocator.match(list(range(5)))
    allocator.acquire(hit)
    allocator.free(blocks)
    assert allocator.num_free == 3  # the partial block is back; the full one is still held
    allocator.free(hit)
    assert allocator.num_free == 4 and allocator.num_cached == 1


def test_only_leaves_are_evicted_so_every_cached_chain_stays_reachable() -> None:
    """Evicting under pressure takes a chain's last block first, even when its first is older."""
    allocator = BlockAllocator(3, SIZE, prefix_caching=True)
    chain = _written(allocator, list(range(12)))
    allocator.free(chain[:1])  # the first block becomes unreferenced first (oldest)
    allocator.free(chain[1:])
    taken = allocator.allocate(1)
    assert taken == [chain[2]] and allocator.match(list(range(12)) + [1]) == chain[:2]


def test_a_duplicate_block_stays_its_writers_own() -> None:
    """Two requests that computed the same tokens: the second's block is not indexed and frees normally."""
    allocator = BlockAllocator(4, SIZE, prefix_caching=True)
    first = _written(allocator, list(range(4)) + [9])
    second = _written(allocator, list(range(4)) + [9])
    assert allocator.num_cached == 1 and allocator.match(list(range(5))) == first[:1]
    allocator.free(second)
    assert allocator.num_free == 2


def test_without_prefix_caching_nothing_is_cached() -> None:
    """--no-prefix-caching: freed blocks go straight back, nothing ever matches."""
    allocator = BlockAllocator(4, SIZE)
    blocks = allocator.allocate(2)
    allocator.index(list(range(8)), blocks, 8)
    allocator.free(blocks)
    assert allocator.match(list(range(9))) == [] and allocator.num_cached == 0 and allocator.num_free == 4


def test_a_pool_needs_blocks() -> None:
    """An empty pool is a clear error."""
    with pytest.raises(ValueError, match="a pool needs blocks"):
        BlockAllocator(0, SIZE, prefix_caching=True)
