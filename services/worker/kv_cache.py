"""A batch's keys and values in preallocated per-layer buffers, written in place at every step.

Each layer keeps one key and one value buffer `[rows, kv_heads, capacity, head_dim]`. Positions
`[start, length)` hold the cache, in the batch's left-padded layout (a row's padding positions hold
finite values its attention mask hides); a forward writes its new positions at `length` and
attends over views of `[start, length + new)`, so a decode step copies one position per layer
instead of the whole cache (a `DynamicCache` grows by `torch.cat`: O(n^2) copying over a sequence).

Filtering works in place too: each dropped row's place is taken by a kept row from the end of the
batch (one row copied per dropped request, not the whole cache into new buffers), and positions
no kept row needs any more are skipped by moving `start`. The buffers keep their size until the
next concatenate, which builds new ones.

The capacity is the batch's planned width (prompt + tokens to come, TGI's padded budget); a forward
that needs more grows the buffers by doubling. Untouched capacity is allocated, not written:
`torch.empty` pages are committed by the OS only when a step first writes them. `length` moves
only after a forward succeeded (`commit`), so a forward that fails half-way leaves the cache as
it was: what it wrote lies beyond `length`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class KVCache:
    """Per-layer key/value buffers of one batch and how many positions are in use."""

    def __init__(self, capacity: int, keys: list[torch.Tensor | None], values: list[torch.Tensor | None],
                 length: int = 0, start: int = 0) -> None:
        self.capacity = capacity
        self.keys = keys
        self.values = values
        self.length = length
        self.start = start

    @classmethod
    def allocate(cls, num_layers: int, capacity: int) -> "KVCache":
        """An empty cache; each layer's buffers are made at its first write, shaped like its states."""
        return cls(capacity, [None] * num_layers, [None] * num_layers)

    @property
    def num_rows(self) -> int:
        return self.keys[0].shape[0] if self.keys[0] is not None else 0

    @property
    def num_positions(self) -> int:
        """Cached positions per row (the columns of the batch's attention mask before this step)."""
        return self.length - self.start

    def for_forward(self) -> Cache:
        """A transformers Cache whose layers write into these buffers (one per model layer)."""
        return Cache(layers=[BufferLayer(self, i) for i in range(len(self.keys))])

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the new positions of `layer` after `length`; views of the live cache including them."""
        if self.keys[layer] is None:
            shape = (keys.shape[0], keys.shape[1], self.capacity, keys.shape[3])
            self.keys[layer], self.values[layer] = keys.new_empty(shape), values.new_empty(shape)
        end = self.length + keys.shape[2]
        if end > self.keys[layer].shape[2]:
            self._grow(layer, end)
        self.keys[layer][:, :, self.length:end] = keys
        self.values[layer][:, :, self.length:end] = values
        return self.keys[layer][:, :, self.start:end], self.values[layer][:, :, self.start:end]

    def commit(self, num_new: int) -> None:
        """The forward that wrote `num_new` positions succeeded: they are part of the cache now."""
        self.length += num_new

    def _grow(self, layer: int, needed: int) -> None:
        capacity = max(needed, 2 * self.keys[layer].shape[2])
        self.keys[layer] = _with_capacity(self.keys[layer], self.start, self.length, capacity)
        self.values[layer] = _with_capacity(self.values[layer], self.start, self.length, capacity)
        self.capacity = max(self.capacity, capacity)

    def select(self, rows: Sequence[int], length: int) -> "KVCache":
        """The cache of `rows` (row i of the result is row `rows[i]`), keeping their last `length`
        positions. In place when every moved row comes from beyond the kept ones (see
        `swap_remove_order`); otherwise into new buffers. `self` must not be used afterwards."""
        start = self.length - length
        moves = [(dest, source) for dest, source in enumerate(rows) if dest != source]
        if any(source < len(rows) for _, source in moves):
            return self._gathered(rows, start)
        for buffers in (self.keys, self.values):
            for layer, buffer in enumerate(buffers):
                for dest, source in moves:
                    buffer[dest, :, start:self.length] = buffer[source, :, start:self.length]
                buffers[layer] = buffer[:len(rows)]
        return KVCache(self.capacity, self.keys, self.values, self.length, start)

    def _gathered(self, rows: Sequence[int], start: int) -> "KVCache":
        index = torch.tensor(rows, device=self.keys[0].device)

        def take(buffer: torch.Tensor) -> torch.Tensor:
            out = buffer.new_empty((len(rows), buffer.shape[1], buffer.shape[2], buffer.shape[3]))
            out[:, :, start:self.length] = buffer[:, :, start:self.length].index_select(0, index)
            return out
        return KVCache(self.capacity, [take(k) for k in self.keys], [take(v) for v in self.values], self.length, start)

    @classmethod
    def concatenate(cls, caches: Sequence["KVCache"], length: int, capacity: int) -> "KVCache":
        """New buffers of all rows, each cache's live positions right-aligned at `length` (zeros
        before), with room for `capacity`."""
        num_rows = sum(c.num_rows for c in caches)

        def stack(buffers: list[torch.Tensor]) -> torch.Tensor:
            first = buffers[0]
            out = first.new_empty((num_rows, first.shape[1], capacity, first.shape[3]))
            out[:, :, :length].zero_()
            start = 0
            for cache, buffer in zip(caches, buffers):
                live = cache.num_positions
                out[start:start + cache.num_rows, :, length - live:length] = buffer[:, :, cache.start:cache.length]
                start += cache.num_rows
            return out
        num_layers = len(caches[0].keys)
        keys = [stack([c.keys[i] for c in caches]) for i in range(num_layers)]
        values = [stack([c.values[i] for c in caches]) for i in range(num_layers)]
        return cls(capacity, keys, values, length)


class BufferLayer(DynamicLayer):
    """One model layer's view of a KVCache, as the transformers attention calls it."""

    def __init__(self, cache: KVCache, layer: int) -> None:
        super().__init__()
        self.cache = cache
        self.layer = layer
        self.is_initialized = cache.keys[layer] is not None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.cache.write(self.layer, key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.cache.num_positions

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.num_positions + query_length, 0


def _with_capacity(buffer: torch.Tensor, start: int, length: int, capacity: int) -> torch.Tensor:
    out = buffer.new_empty((buffer.shape[0], buffer.shape[1], capacity, buffer.shape[3]))
    out[:, :, start:length] = buffer[:, :, start:length]
    return out


def swap_remove_order(num_rows: int, kept: Sequence[int]) -> list[int]:
    """The rows to keep (old indices, in the new order) with the fewest rows moved: the kept rows
    stay where they are, except that each gap a dropped row leaves is filled by the last kept row."""
    kept_set = set(kept)
    order = sorted(kept_set)
    tail = [row for row in range(len(order), num_rows) if row in kept_set]
    holes = [row for row in range(len(order)) if row not in kept_set]
    moved = dict(zip(holes, reversed(tail)))
    return [moved.get(row, row) for row in range(len(order))]


def check_supported(config: object) -> None:
    """Raises TypeError when the model's cache layers are not all plain full-attention layers."""
    for layer in DynamicCache(config=config).layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(f"unsupported KV cache layer {type(layer).__name__}: the padded backend needs "
                            "full attention in every layer (no sliding window)")
