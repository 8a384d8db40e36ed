"""Attention over block tables, for a step whose tokens are flattened into one unpadded batch.

The step's tokens are laid out decodes first (one token per request), then each prefill chunk.
A layer writes the new keys and values into the pool at their slots, then attends: the decode
rows, sorted by context length, in a few groups of similar lengths (one SDPA call per group over
the group's gathered block tables, padded to its longest request and masked, so short requests
do not pay for the longest), and each prefill chunk over its own request's blocks (causal, offset by
what its request already has in the cache). Gathers write into buffers kept between calls: a
fresh multi-megabyte tensor per layer comes from new pages the OS must fault in, which cost more
than the attention itself. BENCHMARKS.md records how the candidate CPU kernels compared
(studies/attention_kernels.py).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ztgi.services.worker.kernels.native_attention import NativeAttention
from ztgi.services.worker.layers.host_copy import to_device
from ztgi.services.worker.layers.kv_pool import KVPool


@dataclasses.dataclass(frozen=True)
class PrefillSpan:
    """One request's prefill chunk: rows `[start, end)` of the step, at positions
    `[cache_len, cache_len + end - start)` of the request, whose blocks are `block_table`."""

    start: int
    end: int
    cache_len: int
    block_table: torch.Tensor  # [blocks covering cache_len + chunk] int64
    window: int | None = None  # a sliding-window layer's: keys within `window` positions of the query

    @property
    def context_len(self) -> int:
        return self.cache_len + self.end - self.start


@dataclasses.dataclass(frozen=True)
class DecodeGroup:
    """Decode rows `[start, end)` of the step and their padded block table and key mask."""

    start: int
    end: int
    block_table: torch.Tensor  # [rows, max blocks] (padded with block 0)
    mask: torch.Tensor  # [rows, 1, 1, max blocks * block_size]: keys to attend
    context_lens: torch.Tensor | None = None  # [rows]
    num_keys: int | None = None  # the longest row's context: keys past it are cut, not masked (None: all)
    sliding: bool = False  # a sliding-window layer's view: the table starts at each row's window

    def windowed(self, window: int) -> DecodeGroup:
        """The same rows attending only to their last `window` keys (query included), over just the
        blocks that hold them: each row's table starts at its window's first block, so a sliding
        layer's decode costs its window, not the whole context."""
        assert self.context_lens is not None
        lengths, device = self.context_lens[:, None], self.block_table.device
        block_size = self.mask.shape[-1] // self.block_table.shape[1]
        first = (lengths - window).clamp(min=0) // block_size  # [rows, 1]
        width = int(((lengths - 1) // block_size - first).max()) + 1
        columns = (first + torch.arange(width, device=device)).clamp(max=self.block_table.shape[1] - 1)
        positions = first * block_size + torch.arange(width * block_size, device=device)
        keep = (positions < lengths) & (positions >= lengths - window)
        return dataclasses.replace(self, block_table=self.block_table.gather(1, columns),
                                   mask=keep[:, None, None, :], num_keys=None, sliding=True)


@dataclasses.dataclass(frozen=True)
class AttentionInputs:
    """What every layer's attention needs for one step, built once per step."""

    slots: torch.Tensor  # [tokens] where each new token's key and value go
    decodes: list[DecodeGroup]
    prefills: list[PrefillSpan]

    def windowed(self, window: int | None) -> AttentionInputs:
        """These inputs for a sliding-window layer (built once per step per window, not per layer)."""
        if window is None:
            return self
        return AttentionInputs(self.slots, [group.windowed(window) for group in self.decodes],
                               [dataclasses.replace(span, window=window) for span in self.prefills])


ROWS_PER_GROUP, MAX_GROUPS = 8, 4


def decode_groups(block_tables: list[list[int]], context_lens: list[int], block_size: int,
                  device: torch.device) -> list[DecodeGroup]:
    """The decode rows (sorted by context length) cut into up to MAX_GROUPS groups of equal size."""
    count = len(block_tables)
    num_groups = min(MAX_GROUPS, -(-count // ROWS_PER_GROUP))
    bounds = [count * g // num_groups for g in range(num_groups + 1)]
    return [_group(block_tables[a:b], context_lens[a:b], a, block_size, device) for a, b in zip(bounds, bounds[1:])]


def _group(block_tables: list[list[int]], context_lens: list[int], start: int, block_size: int,
           device: torch.device) -> DecodeGroup:
    width = max(len(table) for table in block_tables)
    table = torch.tensor([blocks + [0] * (width - len(blocks)) for blocks in block_tables], dtype=torch.int64)
    lengths = torch.tensor(context_lens, dtype=torch.int64)
    mask = torch.arange(width * block_size)[None, :] < lengths[:, None]
    return DecodeGroup(start, start + len(block_tables), to_device(table, device),
                       to_device(mask[:, None, None, :], device), to_device(lengths, device), max(context_lens))


class PagedAttention:
    """Scaled dot-product attention of one step's queries over the pool; `scale` defaults to
    `head_dim ** -0.5`, `softcap` caps the scores (Gemma 2) at the price of an unfused kernel."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None,
                 softcap: float | None = None) -> None:
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.gqa = num_heads != num_kv_heads
        self.scale = scale if scale is not None else 1 / math.sqrt(head_dim)
        self.softcap = softcap
        self._workspace: dict[str, torch.Tensor] = {}
        self.float32_decode = False  # --float32-decode-attention: decode rows on CPU in float32
        self.group_query_heads = True  # decode rows: a key head's query heads in one block of queries
        self.native: NativeAttention | None = None  # the C kernels reading blocks in place (CPU)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: KVPool,
                 inputs: AttentionInputs) -> torch.Tensor:
        """`q` `[tokens, heads, head_dim]`, `k`/`v` `[tokens, kv_heads, head_dim]`; returns
        `[tokens, heads * head_dim]` after writing `k`/`v` into the pool."""
        pool.write(layer, inputs.slots, k, v)
        only = inputs.decodes[0] if len(inputs.decodes) == 1 and not inputs.prefills else None
        if only is not None and only.start == 0 and only.end == q.shape[0]:  # decodes alone: no copy into `out`
            return self._decode(layer, q, pool, only).reshape(q.shape[0], -1)
        out = q.new_empty(q.shape)
        for group in inputs.decodes:
            out[group.start:group.end] = self._decode(layer, q[group.start:group.end], pool, group)
        for span in inputs.prefills:
            out[span.start:span.end] = self._prefill(layer, q, k, v, pool, span)
        return out.view(q.shape[0], -1)

    def _decode(self, layer: int, q: torch.Tensor, pool: KVPool, group: DecodeGroup) -> torch.Tensor:
        lengths = group.context_lens
        if lengths is not None and not self.float32_decode and self._in_place(q, pool.keys[layer], group.sliding):
            assert self.native is not None
            return self.native.decode(q, pool.keys[layer], pool.values[layer], group.block_table, lengths, self.scale)
        table = group.block_table
        rows, width = table.shape
        shape = (rows, width * pool.block_size, self.num_kv_heads, self.head_dim)
        keys = self._gather("keys", pool.keys[layer], table).view(shape).transpose(1, 2)
        values = self._gather("values", pool.values[layer], table).view(shape).transpose(1, 2)
        mask = group.mask
        if group.num_keys is not None:  # the attention kernel then sums over the same keys as a contiguous cache
            keys, values, mask = keys[:, :, :group.num_keys], values[:, :, :group.num_keys], mask[..., :group.num_keys]
        dtype = q.dtype
        if self.float32_decode and q.device.type == "cpu" and q.dtype != torch.float32:
            q, keys, values = q.float(), keys.float(), values.float()
        return self._attend_one_query(q, keys, values, mask).to(dtype)

    def _in_place(self, q: torch.Tensor, pool_keys: torch.Tensor, windowed: bool, prefill: bool = False) -> bool:
        """Whether these queries take the C kernels over the pool rather than torch's gather and SDPA
        (not a sliding-window layer's: the kernels attend to the whole context)."""
        return (self.native is not None and self.softcap is None and not windowed
                and self.native.accepts(q, pool_keys, prefill))

    def _attend_one_query(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor) -> torch.Tensor:
        """Each row's one query `q` `[rows, heads, d]` over its keys `[rows, kv_heads, keys, d]`.

        With grouped-query attention the query heads that share a key head go in as that head's
        block of queries (`[rows, kv_heads, groups, d]`): the same sums per query, one kernel call
        per key head instead of one per query head, and on CPU torch's bfloat16 kernel is many
        times faster for a few queries than for one (BENCHMARKS.md, issue 23)."""
        rows = q.shape[0]
        if not (self.gqa and self.group_query_heads) or self.softcap is not None:
            return self._attend(q.unsqueeze(2), k, v, mask).squeeze(2)
        groups = self.num_heads // self.num_kv_heads
        folded = q.reshape(rows, self.num_kv_heads, groups, self.head_dim)
        out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=self.scale)
        return out.view(rows, self.num_heads, self.head_dim)

    def _prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: KVPool,
                 span: PrefillSpan) -> torch.Tensor:
        if self._in_place(q, pool.keys[layer], span.window is not None, prefill=True):
            assert self.native is not None
            return self.native.prefill(q[span.start:span.end], pool.keys[layer], pool.values[layer],
                                       span.block_table, span.cache_len, self.scale)
        queries = q[span.start:span.end].transpose(0, 1).unsqueeze(0)
        if span.cache_len == 0:  # the chunk is the whole context: its own keys, no gather
            keys = k[span.start:span.end].transpose(0, 1).unsqueeze(0)
            values = v[span.start:span.end].transpose(0, 1).unsqueeze(0)
        else:
            keys, values = (self._span(name, cache[layer], span)
                            for name, cache in (("keys", pool.keys), ("values", pool.values)))
        causal_only = span.cache_len == 0 and span.window is None
        out = self._attend(queries, keys, values, None if causal_only else _offset_causal(span))
        return out.squeeze(0).transpose(0, 1)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of `q` `[b, heads, queries, d]` over `k`/`v` `[b, kv_heads, keys, d]`; `mask`
        (True: attend) or, when None, causal with queries and keys aligned."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                  scale=self.scale, enable_gqa=self.gqa)
        if mask is None:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.tanh(q @ k.transpose(-1, -2) * (self.scale / self.softcap)) * self.softcap
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32)
        return weights.to(q.dtype) @ v

    def _span(self, name: str, cache: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        flat = self._gather(name, cache, span.block_table).view(-1, self.num_kv_heads, self.head_dim)
        return flat[:span.context_len].transpose(0, 1).unsqueeze(0)

    def _gather(self, name: str, cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """`cache[table]` as `[table.numel(), block elements]`, in this kernel's kept buffer `name`
        (valid until the next gather into it)."""
        flat = cache.view(cache.shape[0], -1)
        size = table.numel() * flat.shape[1]
        buffer = self._workspace.get(name)
        if buffer is None or buffer.numel() < size or buffer.dtype != cache.dtype or buffer.device != cache.device:
            buffer = self._workspace[name] = flat.new_empty(size + size // 4)
        out = buffer[:size].view(table.numel(), flat.shape[1])
        return torch.index_select(flat, 0, table.reshape(-1), out=out)


def _offset_causal(span: PrefillSpan) -> torch.Tensor:
    """`[chunk, context]`: query i (position cache_len + i) sees keys up to its own position (and,
    in a sliding-window layer, no further back than the window)."""
    device = span.block_table.device
    keys = torch.arange(span.context_len, device=device)
    queries = torch.arange(span.cache_len, span.context_len, device=device)[:, None]
    keep = keys <= queries
    return keep if span.window is None else keep & (keys > queries - span.window)
