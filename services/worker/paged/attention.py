"""Attention over block tables, for a step whose tokens are flattened into one unpadded batch.

The step's tokens are laid out decodes first (one token per request), then each prefill chunk.
A layer writes the new keys and values into the pool at their slots, then attends: all decode
rows at once over their gathered block tables (one SDPA call, the table padded to the longest
request and masked), and each prefill chunk over its own request's blocks (causal, offset by
what its request already has in the cache). BENCHMARKS.md records how the candidate CPU kernels
compared (benchmarks/attention_kernels.py).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from services.worker.paged.kv_pool import KVPool


@dataclasses.dataclass(frozen=True)
class PrefillSpan:
    """One request's prefill chunk: rows `[start, end)` of the step, at positions
    `[cache_len, cache_len + end - start)` of the request, whose blocks are `block_table`."""

    start: int
    end: int
    cache_len: int
    block_table: torch.Tensor  # [blocks covering cache_len + chunk] int64

    @property
    def context_len(self) -> int:
        return self.cache_len + self.end - self.start


@dataclasses.dataclass(frozen=True)
class AttentionInputs:
    """What every layer's attention needs for one step, built once per step."""

    slots: torch.Tensor  # [tokens] where each new token's key and value go
    num_decodes: int
    decode_block_table: torch.Tensor | None  # [decodes, max blocks] (padded with block 0)
    decode_mask: torch.Tensor | None  # [decodes, 1, 1, max blocks * block_size]: keys to attend
    prefills: list[PrefillSpan]


def decode_inputs(block_tables: list[list[int]], context_lens: list[int], block_size: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode rows' padded block table and key mask."""
    width = max(len(table) for table in block_tables)
    table = torch.zeros((len(block_tables), width), dtype=torch.int64)
    for row, blocks in enumerate(block_tables):
        table[row, :len(blocks)] = torch.tensor(blocks, dtype=torch.int64)
    lengths = torch.tensor(context_lens, dtype=torch.int64)
    mask = torch.arange(width * block_size)[None, :] < lengths[:, None]
    return table.to(device), mask[:, None, None, :].to(device)


class PagedAttention:
    """Scaled dot-product attention of one step's queries over the pool."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.gqa = num_heads != num_kv_heads

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: KVPool,
                 inputs: AttentionInputs) -> torch.Tensor:
        """`q` `[tokens, heads, head_dim]`, `k`/`v` `[tokens, kv_heads, head_dim]`; returns
        `[tokens, heads * head_dim]` after writing `k`/`v` into the pool."""
        pool.write(layer, inputs.slots, k, v)
        out = q.new_empty(q.shape)
        if inputs.num_decodes:
            out[:inputs.num_decodes] = self._decode(layer, q[:inputs.num_decodes], pool, inputs)
        for span in inputs.prefills:
            out[span.start:span.end] = self._prefill(layer, q, k, v, pool, span)
        return out.view(q.shape[0], -1)

    def _decode(self, layer: int, q: torch.Tensor, pool: KVPool, inputs: AttentionInputs) -> torch.Tensor:
        table = inputs.decode_block_table
        rows, width = table.shape
        shape = (rows, width * pool.block_size, self.num_kv_heads, self.head_dim)
        keys = pool.keys[layer][table].view(shape).transpose(1, 2)
        values = pool.values[layer][table].view(shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=inputs.decode_mask,
                                             enable_gqa=self.gqa)
        return out.squeeze(2)

    def _prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: KVPool,
                 span: PrefillSpan) -> torch.Tensor:
        queries = q[span.start:span.end].transpose(0, 1).unsqueeze(0)
        if span.cache_len == 0:  # the chunk is the whole context: its own keys, no gather
            keys = k[span.start:span.end].transpose(0, 1).unsqueeze(0)
            values = v[span.start:span.end].transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, enable_gqa=self.gqa)
        else:
            keys, values = (self._gathered(cache[layer], span) for cache in (pool.keys, pool.values))
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=_offset_causal(span),
                                                 enable_gqa=self.gqa)
        return out.squeeze(0).transpose(0, 1)

    def _gathered(self, cache: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        flat = cache[span.block_table].view(-1, self.num_kv_heads, self.head_dim)
        return flat[:span.context_len].transpose(0, 1).unsqueeze(0)


def _offset_causal(span: PrefillSpan) -> torch.Tensor:
    """`[chunk, context]`: query i (position cache_len + i) sees keys up to its own position."""
    device = span.block_table.device
    keys = torch.arange(span.context_len, device=device)
    queries = torch.arange(span.cache_len, span.context_len, device=device)[:, None]
    return keys <= queries
