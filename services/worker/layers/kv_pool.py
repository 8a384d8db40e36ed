"""The worker's KV cache as one pool of fixed-size blocks per layer (vLLM's PagedAttention).

Each layer has a key and a value tensor `[num_blocks, block_size, kv_heads, head_dim]`. The
scheduler owns the blocks: it gives each request a block table, and the token at position `p`
of a request lives in slot `p % block_size` of block `block_ids[p // block_size]`. Nothing is
copied when batches are filtered or joined: only block tables move. The pool is allocated with
`torch.empty`, so on CPU the OS commits a page only when a step first writes it; a block is zeroed
the first time a request gets it (`prepare`), because attention reads whole blocks and masks the
slots past a request's length: masked garbage that happens to be NaN would still poison the
softmax's products, where stale finite values of an earlier request weigh exactly nothing.
The scheduler hands out never-used blocks in ascending order, so `prepare` zeroes the next
`ZERO_AHEAD` never-used blocks with each fresh one: one fill per layer tensor for dozens of
blocks, not one per block as requests grow.
"""

from __future__ import annotations

import dataclasses

import torch

ZERO_AHEAD = 64  # never-used blocks zeroed along with a fresh one

@dataclasses.dataclass(frozen=True)
class KVShape:
    """What one block holds, per layer: `block_size` tokens of `kv_heads` x `head_dim`."""

    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element_size


PADDING_BLOCK = 0  # what a block table is padded with: always zeroed, never attended


class KVPool:
    """Keys and values of every layer, addressed by slot (`block * block_size + offset`)."""

    def __init__(self, shape: KVShape, num_blocks: int, device: torch.device) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got {num_blocks}")
        self.shape = shape
        self.num_blocks = num_blocks
        size = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
        self.keys = [torch.empty(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        self.values = [torch.empty(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        by_slot = (-1, shape.num_kv_heads, shape.head_dim)  # the same memory, a row per slot: `write`'s views
        self._slot_keys = [t.view(by_slot) for t in self.keys]
        self._slot_values = [t.view(by_slot) for t in self.values]
        self._ready = bytearray(num_blocks)  # 1: zeroed or written once
        self.prepare([PADDING_BLOCK])

    def prepare(self, block_ids: list[int]) -> None:
        """Zeroes the blocks among `block_ids` that were never used, with the never-used ones up to
        `ZERO_AHEAD` after each (ids must be in the pool)."""
        fresh = {b for b in block_ids if not self._ready[b]}
        if not fresh:
            return
        ready = self._ready
        for block in list(fresh):
            fresh.update(b for b in range(block + 1, min(block + ZERO_AHEAD, self.num_blocks)) if not ready[b])
        index = torch.tensor(sorted(fresh), dtype=torch.int64, device=self.keys[0].device)
        for tensor in (*self.keys, *self.values):
            tensor.index_fill_(0, index, 0)
        for block in fresh:
            self._ready[block] = 1

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Stores `keys`/`values` `[tokens, kv_heads, head_dim]` at `slots` `[tokens]`."""
        self._slot_keys[layer].index_copy_(0, slots, keys)
        self._slot_values[layer].index_copy_(0, slots, values)
