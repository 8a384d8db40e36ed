"""The batch's own per-layer key/value tensors, wrapped in a transformers DynamicCache per step.

A batch keeps plain `(keys, values)` tensors per layer, `[batch, kv_heads, seq, head_dim]`, so
filter and concatenate are tensor slicing and padding. Each forward gets a fresh DynamicCache
around them; its layers grow by `torch.cat`, which leaves the batch's tensors untouched, so a
forward that fails half-way cannot corrupt the batch it was given.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

LayerKV = tuple[torch.Tensor, torch.Tensor]


def wrap(past: list[LayerKV]) -> DynamicCache:
    """A DynamicCache whose layers hold `past` as they are (no copy)."""
    cache = DynamicCache()
    for keys, values in past:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def unwrap(cache: DynamicCache) -> list[LayerKV]:
    """The per-layer tensors of a cache after a forward; only full-attention layers are supported."""
    for layer in cache.layers:
        _require_full_attention(layer)
    return [(layer.keys, layer.values) for layer in cache.layers]


def check_supported(config: object) -> None:
    """Raises TypeError when the model's cache layers are not all plain full-attention layers."""
    for layer in DynamicCache(config=config).layers:
        _require_full_attention(layer)


def _require_full_attention(layer: object) -> None:
    if type(layer) is not DynamicLayer:
        raise TypeError(f"unsupported KV cache layer {type(layer).__name__}: the padded backend needs "
                        "full attention in every layer (no sliding window)")
