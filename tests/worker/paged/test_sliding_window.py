"""PagedAttention with a sliding window and soft-capping, against attention written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention, PrefillSpan, decode_groups
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 4, 4, 2, 8, 6
TABLES = {3: [5], 21: [1, 2, 3, 7, 9, 11], 14: [4, 6, 8, 10]}  # context length -> block table


def _pool() -> KVPool:
    pool = KVPool(KVShape(1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.float32), 16, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    pool.keys[0].copy_(torch.randn(pool.keys[0].shape, generator=generator))
    pool.values[0].copy_(torch.randn(pool.values[0].shape, generator=generator))
    return pool


def _by_hand(pool: KVPool, q: torch.Tensor, table: list[int], position: int, window: int | None,
             softcap: float | None) -> torch.Tensor:
    """One query at `position` over the keys its window allows, read slot by slot."""
    first = 0 if window is None else max(0, position - window + 1)
    slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(first, position + 1)]
    keys = pool.keys[0].view(-1, KV_HEADS, HEAD_DIM)[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
    values = pool.values[0].view(-1, KV_HEADS, HEAD_DIM)[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,khd->hk", q, keys) / math.sqrt(HEAD_DIM)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return torch.einsum("hk,khd->hd", scores.softmax(-1), values).reshape(-1)


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_decode_and_chunk_attend_within_the_window(window, softcap):
    """Decode rows of three context lengths (one shorter than the window) and a prefill chunk at an
    offset: each query attends to exactly the last `window` keys, with or without soft-capping."""
    pool, attention = _pool(), PagedAttention(HEADS, KV_HEADS, HEAD_DIM, softcap=softcap)
    lengths = sorted(TABLES)
    chunk_start, chunk_len, chunk_table = 9, 5, TABLES[14]  # positions 9..13 of the 14-token request
    slots = [TABLES[n][(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE for n in lengths]
    slots += [chunk_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
              for p in range(chunk_start, chunk_start + chunk_len)]
    groups = decode_groups([TABLES[n] for n in lengths], lengths, BLOCK_SIZE, torch.device("cpu"))
    span = PrefillSpan(len(lengths), len(lengths) + chunk_len, chunk_start, torch.tensor(chunk_table))
    inputs = AttentionInputs(torch.tensor(slots), groups, [span]).windowed(window)
    tokens = len(slots)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(tokens, heads, HEAD_DIM, generator=generator) for heads in (HEADS, KV_HEADS, KV_HEADS))
    out = attention(0, q, k, v, pool, inputs)
    rows = [(TABLES[n], n - 1) for n in lengths] + [(chunk_table, p) for p in range(chunk_start, 14)]
    for row, (table, position) in enumerate(rows):
        torch.testing.assert_close(out[row], _by_hand(pool, q[row], table, position, window, softcap))
