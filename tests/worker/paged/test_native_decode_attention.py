"""The in-place decode attention kernel against exact attention, torch's path, and where it is not built."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from services.worker.paged.attention import PagedAttention, decode_groups
from services.worker.paged.native_decode_attention import NativeDecodeAttention

KERNEL = NativeDecodeAttention.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no AVX512-BF16 CPU or no C compiler here")
BLOCK_SIZE = 16


class Pool:
    """A layer's key and value blocks, as `KVPool` holds them: `[blocks, block_size, kv_heads, head_dim]`."""

    def __init__(self, num_blocks: int, kv_heads: int, head_dim: int, generator: torch.Generator) -> None:
        shape = (num_blocks, BLOCK_SIZE, kv_heads, head_dim)
        self.block_size = BLOCK_SIZE
        self.keys = [(torch.randn(shape, generator=generator) * 2).to(torch.bfloat16)]
        self.values = [torch.randn(shape, generator=generator).to(torch.bfloat16)]


def scattered_tables(lens: list[int], num_blocks: int, seed: int) -> list[list[int]]:
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    tables, used = [], 0
    for length in lens:
        count = -(-length // BLOCK_SIZE)
        tables.append(order[used:used + count])
        used += count
    return tables


def exact(q: torch.Tensor, pool: Pool, table: list[int], length: int) -> torch.Tensor:
    """One row's attention in float64 from the blocks of `table`."""
    heads, kv_heads = q.shape[0], pool.keys[0].shape[2]
    keys, values = (cache[0][torch.tensor(table)].flatten(0, 1)[:length].double().repeat_interleave(
        heads // kv_heads, dim=1) for cache in (pool.keys, pool.values))
    weights = (torch.einsum("hd,khd->hk", q.double(), keys) / q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("hk,khd->hd", weights, values)


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 3, 96)])
def test_rows_equal_exact_attention_rounded(heads, kv_heads, head_dim):
    """Rows of 1 to 400 keys over scattered blocks, with and without grouped queries: nearly every
    output is exact attention rounded to bfloat16, and the rest are one rounding away; torch's
    gather-and-SDPA path, which rounds the weights to bfloat16, is further off on average."""
    generator = torch.Generator().manual_seed(heads * head_dim)
    lens = sorted([1, 15, 16, 17, 64, 200, 399, 400, *[random.Random(i).randint(1, 400) for i in range(4)]])
    pool = Pool(sum(-(-n // BLOCK_SIZE) for n in lens) + 3, kv_heads, head_dim, generator)
    tables = scattered_tables(lens, pool.keys[0].shape[0], seed=head_dim)
    q = (torch.randn(len(lens), heads, head_dim, generator=generator) * 2).to(torch.bfloat16)
    expected = torch.stack([exact(q[r], pool, tables[r], lens[r]) for r in range(len(lens))])
    attention = PagedAttention(heads, kv_heads, head_dim)
    groups = decode_groups(tables, lens, BLOCK_SIZE, torch.device("cpu"))
    results = {}
    for name, kernel in (("in place", KERNEL), ("torch", None)):
        attention.native_decode = kernel
        results[name] = torch.cat([attention._decode(0, q[g.start:g.end], pool, g) for g in groups]).double()
    rounded = expected.to(torch.bfloat16).double()
    bound = rounded.abs() * 2**-7 + 1e-5  # one rounding, and float32 sums' error where outputs near zero cancel
    in_place, through_torch = results["in place"], results["torch"]
    assert (in_place == rounded).double().mean() > 0.99
    assert ((in_place - expected).abs() <= bound).all()
    assert (in_place - expected).abs().mean() <= (through_torch - expected).abs().mean()


@needs_kernel
def test_inputs_it_cannot_take_are_refused_not_misread():
    """A context longer than the row's table covers is refused with the shapes, not read past the
    table; float32 queries are not offered to the kernel at all."""
    pool = Pool(4, 3, 64, torch.Generator().manual_seed(0))
    q = torch.randn(1, 9, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="refused its inputs"):
        KERNEL(q, pool.keys[0], pool.values[0], torch.tensor([[0, 1]]), torch.tensor([33]), 0.125)
    assert not KERNEL.accepts(q.float(), pool.keys[0])
    assert KERNEL.accepts(q, pool.keys[0])


@pytest.mark.parametrize("broken", ["compiler fails", "cache not writable"])
def test_where_it_cannot_be_built_torch_attends_and_the_log_says_why(broken, monkeypatch, tmp_path, caplog):
    """Where the kernel cannot be built (a compiler that fails; a cache directory that cannot be
    made), loading says why and gives None: the worker's attention stays on torch's path."""
    if broken == "compiler fails":
        monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path))
        monkeypatch.setenv("CC", "false")
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with caplog.at_level(logging.INFO):
        assert NativeDecodeAttention.load() is None
    assert "torch's" in caplog.text
