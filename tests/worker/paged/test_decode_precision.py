"""Decode attention on CPU: `--float32-decode-attention` (bfloat16 decode rows attend in float32, the
rest unchanged) and the query heads of a key head attending as one block."""

from __future__ import annotations

import torch

from ztgi.common.config import parse_config
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention, PrefillSpan, decode_groups
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape
from ztgi.services.worker.model_loader import load_model

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM = 4, 4, 2, 8
TABLES = {3: [5], 21: [1, 2, 3, 7, 9, 11], 14: [4, 6, 8, 10]}  # context length -> block table


def _step(dtype: torch.dtype) -> tuple[KVPool, AttentionInputs, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three decode rows and a 5-token prefill chunk at an offset, over a random bfloat16 pool."""
    pool = KVPool(KVShape(1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype), 16, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for cache in (pool.keys[0], pool.values[0]):
        cache.copy_(torch.randn(cache.shape, generator=generator))
    lengths = sorted(TABLES)
    slots = [TABLES[n][(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE for n in lengths]
    slots += [TABLES[14][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(9, 14)]
    groups = decode_groups([TABLES[n] for n in lengths], lengths, BLOCK_SIZE, torch.device("cpu"))
    inputs = AttentionInputs(torch.tensor(slots), groups, [PrefillSpan(3, 8, 9, torch.tensor(TABLES[14]))])
    q, k, v = (torch.randn(len(slots), heads, HEAD_DIM, generator=generator).to(dtype)
               for heads in (HEADS, KV_HEADS, KV_HEADS))
    return pool, inputs, q, k, v


def _attend(dtype: torch.dtype, float32_decode: bool) -> torch.Tensor:
    pool, inputs, q, k, v = _step(dtype)
    attention = PagedAttention(HEADS, KV_HEADS, HEAD_DIM)
    attention.float32_decode = float32_decode
    return attention(0, q, k, v, pool, inputs)


def test_bfloat16_decode_rows_equal_float32_attention_rounded_once():
    """The decode rows are float32 attention over the same bfloat16 values, rounded to bfloat16 once
    at the end; the prefill rows are the bfloat16 kernel's as before; both near the bfloat16 kernel."""
    upcast, plain = _attend(torch.bfloat16, True), _attend(torch.bfloat16, False)
    pool, inputs, q, k, v = _step(torch.bfloat16)
    pool32 = KVPool(KVShape(1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.float32), 16, torch.device("cpu"))
    pool32.keys[0].copy_(pool.keys[0].float())
    pool32.values[0].copy_(pool.values[0].float())
    in_float32 = PagedAttention(HEADS, KV_HEADS, HEAD_DIM)(0, q.float(), k.float(), v.float(), pool32, inputs)
    assert upcast.dtype == torch.bfloat16
    torch.testing.assert_close(upcast[:3], in_float32[:3].bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(upcast[3:], plain[3:], rtol=0, atol=0)
    torch.testing.assert_close(upcast.float(), plain.float(), rtol=2e-2, atol=2e-2)


def test_float32_steps_are_unchanged():
    torch.testing.assert_close(_attend(torch.float32, True), _attend(torch.float32, False), rtol=0, atol=0)


def test_flag_reaches_the_paged_model_from_worker_and_launcher(tiny_model_dir: str):
    """Off by default; `--float32-decode-attention` sets it on the model's attention; the launcher
    passes it to its workers."""
    assert not WorkerConfig().float32_decode_attention
    config = parse_config(WorkerConfig, ["--float32-decode-attention"])
    model = load_model(tiny_model_dir, "bfloat16", "cpu", kv_cache="paged",
                       float32_decode_attention=config.float32_decode_attention)
    assert model.forward_pass.attention.float32_decode
    assert not load_model(tiny_model_dir, "bfloat16", "cpu", kv_cache="paged").forward_pass.attention.float32_decode
    env = LaunchConfig(float32_decode_attention=True).shared_environment("tcp://127.0.0.1:5554")
    assert env["ZTGI_FLOAT32_DECODE_ATTENTION"] == "True"


def test_query_heads_of_a_key_head_attend_as_one_block_as_each_head_alone():
    """Decode rows' query heads that share a key head go in as one block of queries: the same
    attention as one call per query head, up to the kernel's summation order."""
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        pool, inputs, q, k, v = _step(dtype)
        grouped, per_head = PagedAttention(HEADS, KV_HEADS, HEAD_DIM), PagedAttention(HEADS, KV_HEADS, HEAD_DIM)
        per_head.group_query_heads = False
        got, expected = grouped(0, q, k, v, pool, inputs), per_head(0, q, k, v, pool, inputs)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), expected.float(), rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(got[3:], expected[3:], rtol=0, atol=0)  # the prefill rows: unchanged
