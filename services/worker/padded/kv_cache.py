"""A batch's keys and values in preallocated per-layer buffers, written in place at every step.

Each layer keeps one key and one value buffer `[rows, kv_heads, capacity, head_dim]`. Positions
`[start, length)` hold the cache, in the batch's left-padded layout (a row's padding positions hold
finite values its attention mask hides); a forward writes its new positions at `length` and
attends over views of `[start, length + new)`, so a decode step copies one position per layer
instead of the whole cache (a `DynamicCache` grows by `torch.cat`: O(n^2) copying over a sequence).

Filtering works in place too: each dropped row's place is taken by a kept row from the end of the
batch (one row copied per dropped request, not the whole cache into new buffers), and positions
no kept row needs any more are skipped by moving `start`. The buffers keep their size: a later
concatenate writes newcomers into the freed rows, and builds new buffers only when the rows or
the room run out.

The capacity is the batch's planned width (prompt + tokens to come, TGI's padded budget); a forward
that needs more grows the buffers by doubling. Untouched capacity is allocated, not written:
`torch.empty` pages are committed by the OS only when a step first writes them. `length` moves
only after a forward succeeded (`commit`), so a forward that fails half-way leaves the cache as
it was: what it wrote lies beyond `length`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from ztgi.services.worker.layers.transformers_module import TransformersConfig


class KVCache:
    """Per-layer key/value buffers of one batch: rows `[0, num_rows)`, positions `[start, length)`.

    `key_buffers`/`value_buffers` are the whole allocations; `keys`/`values` the rows in use.
    """

    def __init__(self, capacity: int, key_buffers: list[torch.Tensor | None],
                 value_buffers: list[torch.Tensor | None], num_rows: int = 0, length: int = 0,
                 start: int = 0) -> None:
        self.capacity = capacity
        self.key_buffers = key_buffers
        self.value_buffers = value_buffers
        self.num_rows = num_rows
        self.length = length
        self.start = start

    @classmethod
    def allocate(cls, num_layers: int, capacity: int) -> KVCache:
        """An empty cache; each layer's buffers are made at its first write, shaped like its states."""
        return cls(capacity, [None] * num_layers, [None] * num_layers)

    @property
    def keys(self) -> list[torch.Tensor | None]:
        return [None if b is None else b[:self.num_rows] for b in self.key_buffers]

    @property
    def values(self) -> list[torch.Tensor | None]:
        return [None if b is None else b[:self.num_rows] for b in self.value_buffers]

    @property
    def num_positions(self) -> int:
        """Cached positions per row (the columns of the batch's attention mask before this step)."""
        return self.length - self.start

    def for_forward(self) -> Cache:
        """A transformers Cache whose layers write into these buffers (one per model layer)."""
        return Cache(layers=[BufferLayer(self, i) for i in range(len(self.key_buffers))])

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes the new positions of `layer` after `length`; views of the live cache including them."""
        key_buffer, value_buffer = self.key_buffers[layer], self.value_buffers[layer]
        if key_buffer is None or value_buffer is None:
            shape = (keys.shape[0], keys.shape[1], self.capacity, keys.shape[3])
            key_buffer, value_buffer = keys.new_empty(shape), values.new_empty(shape)
            self.key_buffers[layer], self.value_buffers[layer] = key_buffer, value_buffer
            self.num_rows = keys.shape[0]
        end = self.length + keys.shape[2]
        if end > key_buffer.shape[2]:
            key_buffer, value_buffer = self._grow(layer, key_buffer, value_buffer, end)
        rows = self.num_rows
        key_buffer[:rows, :, self.length:end] = keys
        value_buffer[:rows, :, self.length:end] = values
        return key_buffer[:rows, :, self.start:end], value_buffer[:rows, :, self.start:end]

    def commit(self, num_new: int) -> None:
        """The forward that wrote `num_new` positions succeeded: they are part of the cache now."""
        self.length += num_new

    def _grow(self, layer: int, key_buffer: torch.Tensor, value_buffer: torch.Tensor,
              needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        capacity = max(needed, 2 * key_buffer.shape[2])
        key_buffer, value_buffer = self._copied(key_buffer, capacity), self._copied(value_buffer, capacity)
        self.key_buffers[layer], self.value_buffers[layer] = key_buffer, value_buffer
        self.capacity = max(self.capacity, capacity)
        return key_buffer, value_buffer

    def _copied(self, buffer: torch.Tensor, capacity: int) -> torch.Tensor:
        out = buffer.new_empty((buffer.shape[0], buffer.shape[1], capacity, buffer.shape[3]))
        out[:self.num_rows, :, self.start:self.length] = buffer[:self.num_rows, :, self.start:self.length]
        return out

    def _written(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The key and value buffers of a cache whose every layer has been written (by a forward)."""
        keys = [b for b in self.key_buffers if b is not None]
        values = [b for b in self.value_buffers if b is not None]
        assert len(keys) == len(values) == len(self.key_buffers), "a layer of this cache was never written"
        return keys, values

    # -- filter --------------------------------------------------------------------------------

    def select(self, rows: Sequence[int], length: int) -> KVCache:
        """The cache of `rows` (row i of the result is row `rows[i]`), keeping their last `length`
        positions. In place when every moved row comes from beyond the kept ones (see
        `swap_remove_order`); otherwise into new buffers. `self` must not be used afterwards."""
        start = self.length - length
        moves = [(dest, source) for dest, source in enumerate(rows) if dest != source]
        if any(source < len(rows) for _, source in moves):
            return self._gathered(rows, start)
        keys, values = self._written()
        for buffer in (*keys, *values):
            for dest, source in moves:
                buffer[dest, :, start:self.length] = buffer[source, :, start:self.length]
        return KVCache(self.capacity, self.key_buffers, self.value_buffers, len(rows), self.length, start)

    def _gathered(self, rows: Sequence[int], start: int) -> KVCache:
        keys, values = self._written()
        index = torch.tensor(rows, device=keys[0].device)

        def take(buffer: torch.Tensor) -> torch.Tensor:
            out = buffer.new_empty((len(rows), *buffer.shape[1:]))
            out[:, :, start:self.length] = buffer[:, :, start:self.length].index_select(0, index)
            return out
        return KVCache(self.capacity, [take(k) for k in keys], [take(v) for v in values],
                       len(rows), self.length, start)

    # -- concatenate ---------------------------------------------------------------------------

    @classmethod
    def concatenate(cls, caches: Sequence[KVCache], length: int, capacity: int) -> KVCache:
        """All rows, each cache's live positions right-aligned at `length` (zeros before), with room
        for `capacity` positions. The first cache takes the others in, in place, when its buffers
        have the rows and the room (a running batch whose finished rows were filtered out);
        otherwise new buffers are made, with spare room for the next ones."""
        first, others = caches[0], caches[1:]
        if first._has_room_for(others, length, capacity):
            return first._absorb(others, length)
        return cls._stacked(caches, length, capacity)

    def _has_room_for(self, others: Sequence[KVCache], length: int, capacity: int) -> bool:
        start = self.length - length
        first_keys = self._written()[0][0]
        return (start >= 0 and start + capacity <= first_keys.shape[2]
                and self.num_rows + sum(c.num_rows for c in others) <= first_keys.shape[0])

    def _absorb(self, others: Sequence[KVCache], length: int) -> KVCache:
        start = self.length - length
        written = [self._written(), *(c._written() for c in others)]
        for layer in range(len(self.key_buffers)):
            for buffers, parts in ((written[0][0], [w[0] for w in written[1:]]),
                                   (written[0][1], [w[1] for w in written[1:]])):
                buffer = buffers[layer]
                buffer[:self.num_rows, :, start:self.start].zero_()  # when a newcomer is longer
                row = self.num_rows
                for cache, part in zip(others, parts):
                    live, rows = cache.num_positions, slice(row, row + cache.num_rows)
                    buffer[rows, :, start:self.length - live].zero_()
                    buffer[rows, :, self.length - live:self.length] = part[layer][:cache.num_rows, :,
                                                                                  cache.start:cache.length]
                    row += cache.num_rows
        num_rows = self.num_rows + sum(c.num_rows for c in others)
        return KVCache(self.capacity, self.key_buffers, self.value_buffers, num_rows, self.length, start)

    @classmethod
    def _stacked(cls, caches: Sequence[KVCache], length: int, capacity: int) -> KVCache:
        num_rows = sum(c.num_rows for c in caches)
        width = capacity + capacity // 2  # spare room: the next newcomers may fit in place

        def stack(parts: list[torch.Tensor]) -> torch.Tensor:
            first = parts[0]
            out = first.new_empty((num_rows, first.shape[1], width, first.shape[3]))
            out[:, :, :length].zero_()
            row = 0
            for cache, part in zip(caches, parts):
                live = cache.num_positions
                out[row:row + cache.num_rows, :, length - live:length] = \
                    part[:cache.num_rows, :, cache.start:cache.length]
                row += cache.num_rows
            return out
        num_layers = len(caches[0].key_buffers)
        written = [c._written() for c in caches]
        keys: list[torch.Tensor | None] = [stack([w[0][i] for w in written]) for i in range(num_layers)]
        values: list[torch.Tensor | None] = [stack([w[1][i] for w in written]) for i in range(num_layers)]
        return cls(width, keys, values, num_rows, length)


class BufferLayer(DynamicLayer):
    """One model layer's view of a KVCache, as the transformers attention calls it."""

    def __init__(self, cache: KVCache, layer: int) -> None:
        super().__init__()
        self.cache = cache
        self.layer = layer
        self.is_initialized = cache.key_buffers[layer] is not None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.cache.write(self.layer, key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.cache.num_positions

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.num_positions + query_length, 0


def swap_remove_order(num_rows: int, kept: Sequence[int]) -> list[int]:
    """The rows to keep (old indices, in the new order) with the fewest rows moved: the kept rows
    stay where they are, except that each gap a dropped row leaves is filled by the last kept row."""
    kept_set = set(kept)
    order = sorted(kept_set)
    tail = [row for row in range(len(order), num_rows) if row in kept_set]
    holes = [row for row in range(len(order)) if row not in kept_set]
    moved = dict(zip(holes, reversed(tail)))
    return [moved.get(row, row) for row in range(len(order))]


def check_supported(config: TransformersConfig) -> None:
    """Raises TypeError when the model's cache layers are not all plain full-attention layers."""
    for layer in DynamicCache(config=config).layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(f"unsupported KV cache layer {type(layer).__name__}: the padded backend needs "
                            "full attention in every layer (no sliding window)")
