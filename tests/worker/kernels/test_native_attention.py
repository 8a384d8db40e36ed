"""The C attention kernels against exact attention and torch's path, and where they are not built."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from ztgi.services.worker.kernels.native_attention import NativeAttention
from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention, PrefillSpan, decode_groups
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape

KERNELS = NativeAttention.load()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no AVX512-BF16 CPU or no C compiler here")
FLOAT32_KERNELS = NativeAttention.load(torch.float32)
needs_float32_kernels = pytest.mark.skipif(FLOAT32_KERNELS is None, reason="no AVX2 CPU or no C compiler here")
BLOCK_SIZE = 16


class Pool:
    """A layer's key and value blocks, as `KVPool` holds them: `[blocks, block_size, kv_heads, head_dim]`."""

    def __init__(self, num_blocks: int, kv_heads: int, head_dim: int, generator: torch.Generator,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        shape = (num_blocks, BLOCK_SIZE, kv_heads, head_dim)
        self.block_size = BLOCK_SIZE
        self.keys = [(torch.randn(shape, generator=generator) * 2).to(dtype)]
        self.values = [torch.randn(shape, generator=generator).to(dtype)]


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
    """One query's attention `[heads, head_dim]` in float64 over the first `length` keys of `table`'s blocks."""
    heads, kv_heads = q.shape[0], pool.keys[0].shape[2]
    keys, values = (cache[0][torch.tensor(table)].flatten(0, 1)[:length].double().repeat_interleave(
        heads // kv_heads, dim=1) for cache in (pool.keys, pool.values))
    weights = (torch.einsum("hd,khd->hk", q.double(), keys) / q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("hk,khd->hd", weights, values)


MIXED_HEADS = (9, 3, 64)  # heads, kv_heads, head_dim of `mixed_step`


def mixed_step(dtype: torch.dtype) -> tuple[KVPool, torch.Tensor, torch.Tensor, torch.Tensor, AttentionInputs]:
    """One layer's step of two decode rows (40 and 90 keys), a fresh chunk of 30 and a chunk of 20
    after 100 cached keys, over a filled pool of scattered blocks: the pool, q, k, v and the inputs."""
    generator = torch.Generator().manual_seed(7)
    heads, kv_heads, head_dim = MIXED_HEADS
    pool = KVPool(KVShape(1, BLOCK_SIZE, kv_heads, head_dim, dtype), 64, torch.device("cpu"))
    filled = Pool(64, kv_heads, head_dim, generator, dtype)
    pool.keys[0].copy_(filled.keys[0])
    pool.values[0].copy_(filled.values[0])
    tables = [[block + 1 for block in table] for table in scattered_tables([40, 90, 30, 120], 63, seed=3)]
    slots = [t[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
             for t, positions in zip(tables, ([39], [89], range(30), range(100, 120))) for p in positions]
    q, k, v = (torch.randn(len(slots), h, head_dim, generator=generator).to(dtype) for h in (heads, kv_heads, kv_heads))
    inputs = AttentionInputs(torch.tensor(slots), decode_groups(tables[:2], [40, 90], BLOCK_SIZE, torch.device("cpu")),
                             [PrefillSpan(2, 32, 0, torch.tensor(tables[2])),
                              PrefillSpan(32, 52, 100, torch.tensor(tables[3]))])
    return pool, q, k, v, inputs


def assert_close_to_exact(got: torch.Tensor, through_torch: torch.Tensor, expected: torch.Tensor,
                          rounded_share: float) -> None:
    """At least `rounded_share` of `got` is `expected` rounded to bfloat16, every output is within one
    rounding of it, and on average `got` is no further from it than torch's path `through_torch`."""
    rounded = expected.to(torch.bfloat16).double()
    bound = rounded.abs() * 2**-7 + 1e-5  # one rounding, and float32 sums' error where outputs near zero cancel
    got, through_torch = got.double(), through_torch.double()
    assert (got == rounded).double().mean() >= rounded_share
    assert ((got - expected).abs() <= bound).all()
    assert (got - expected).abs().mean() <= (through_torch - expected).abs().mean() * 1.01


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 3, 96)])
def test_decode_rows_equal_exact_attention_rounded(heads, kv_heads, head_dim):
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
    for name, kernels in (("in place", KERNELS), ("torch", None)):
        attention.native = kernels
        results[name] = torch.cat([attention._decode(0, q[g.start:g.end], pool, g) for g in groups])
    assert_close_to_exact(results["in place"], results["torch"], expected, rounded_share=0.99)


@needs_kernels
@pytest.mark.parametrize("length", [127, 128, 129, 700, 2049])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_one_long_row_split_among_threads_equals_exact_attention(length, num_threads):
    """A single decode row over a long context, its keys split among the threads (each part's
    softmax merged after), as the same row done whole: within one rounding of exact attention."""
    generator = torch.Generator().manual_seed(length)
    pool = Pool(-(-length // BLOCK_SIZE) + 2, 3, 64, generator)
    table = scattered_tables([length], pool.keys[0].shape[0], seed=length)[0]
    q = (torch.randn(1, 9, 64, generator=generator) * 2).to(torch.bfloat16)
    expected = exact(q[0], pool, table, length)[None]
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        got = KERNELS.decode(q, pool.keys[0], pool.values[0], torch.tensor([table]), torch.tensor([length]), 0.125)
    finally:
        torch.set_num_threads(before)
    rounded = expected.to(torch.bfloat16).double()
    assert ((got.double() - expected).abs() <= rounded.abs() * 2**-7 + 1e-5).all()
    assert (got.double() == rounded).double().mean() > 0.98


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128)])
@pytest.mark.parametrize("cache_len,chunk", [(0, 1), (0, 23), (0, 300), (37, 1), (100, 77), (250, 200)])
def test_prefill_chunks_equal_exact_causal_attention(heads, kv_heads, head_dim, cache_len, chunk):
    """A chunk of queries at positions cache_len.. over scattered blocks holding the cached keys and
    its own: each query sees the keys up to its own position, and nearly every output is exact
    causal attention rounded to bfloat16 (torch's flash kernel, which rounds the weights to
    bfloat16, is further off on average)."""
    generator = torch.Generator().manual_seed(cache_len * 1000 + chunk)
    context = cache_len + chunk
    pool = Pool(-(-context // BLOCK_SIZE) + 4, kv_heads, head_dim, generator)
    table = scattered_tables([context], pool.keys[0].shape[0], seed=chunk)[0]
    q = (torch.randn(chunk, heads, head_dim, generator=generator) * 2).to(torch.bfloat16)
    expected = torch.stack([exact(q[i], pool, table, cache_len + i + 1) for i in range(chunk)])
    attention = PagedAttention(heads, kv_heads, head_dim)
    span = PrefillSpan(0, chunk, cache_len, torch.tensor(table))
    own = [cache[0][torch.tensor(table)].flatten(0, 1)[cache_len:context] for cache in (pool.keys, pool.values)]
    results = {}
    for name, kernels in (("in place", KERNELS), ("torch", None)):
        attention.native = kernels
        results[name] = attention._prefill(0, q, *own, pool, span)
    assert_close_to_exact(results["in place"], results["torch"], expected, rounded_share=0.99)


@needs_kernels
def test_a_step_of_decodes_and_chunks_through_the_kernels_equals_torchs():
    """One layer's whole call (pool writes, two decode rows, a fresh chunk and a continued one) gives
    torch's path's outputs up to bfloat16 roundings."""
    pool, q, k, v, inputs = mixed_step(torch.bfloat16)
    results = {}
    for name, kernels in (("in place", KERNELS), ("torch", None)):
        attention = PagedAttention(*MIXED_HEADS)
        attention.native = kernels
        results[name] = attention(0, q, k, v, pool, inputs).double()
    difference = (results["in place"] - results["torch"]).abs()
    assert difference.max() <= 0.02 and difference.mean() <= 1e-3  # outputs of about 1: bfloat16 roundings


@needs_kernels
def test_inputs_it_cannot_take_are_refused_not_misread():
    """A context longer than the table covers, or a block id outside the pool, is refused with the
    shapes, not read; float32 queries are not offered to the kernels at all."""
    pool = Pool(4, 3, 64, torch.Generator().manual_seed(0))
    q = torch.randn(1, 9, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="decode attention kernel refused its inputs"):
        KERNELS.decode(q, pool.keys[0], pool.values[0], torch.tensor([[0, 1]]), torch.tensor([33]), 0.125)
    with pytest.raises(ValueError, match="prefill attention kernel refused its inputs"):
        KERNELS.prefill(q, pool.keys[0], pool.values[0], torch.tensor([0, 1]), 32, 0.125)
    for beyond in (4, -1):  # a block id outside the pool
        with pytest.raises(ValueError, match="decode attention kernel refused"):
            KERNELS.decode(q, pool.keys[0], pool.values[0], torch.tensor([[0, beyond]]), torch.tensor([20]), 0.125)
        with pytest.raises(ValueError, match="prefill attention kernel refused"):
            KERNELS.prefill(q, pool.keys[0], pool.values[0], torch.tensor([0, beyond]), 19, 0.125)
    assert not KERNELS.accepts(q.float(), pool.keys[0])
    assert KERNELS.accepts(q, pool.keys[0])


@needs_float32_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128), (6, 3, 96), (4, 2, 40)])
def test_float32_decode_rows_equal_exact_attention(heads, kv_heads, head_dim):
    """The float32 kernel (AVX2), rows of 1 to 400 keys over scattered blocks: within float32's
    rounding of exact attention, and on average no further from it than torch's gather-and-SDPA path."""
    generator = torch.Generator().manual_seed(heads * head_dim)
    lens = sorted([1, 7, 8, 9, 15, 16, 17, 64, 200, 399, 400, *[random.Random(i).randint(1, 400) for i in range(4)]])
    pool = Pool(sum(-(-n // BLOCK_SIZE) for n in lens) + 3, kv_heads, head_dim, generator, torch.float32)
    tables = scattered_tables(lens, pool.keys[0].shape[0], seed=head_dim)
    q = torch.randn(len(lens), heads, head_dim, generator=generator) * 2
    expected = torch.stack([exact(q[r], pool, tables[r], lens[r]) for r in range(len(lens))])
    attention = PagedAttention(heads, kv_heads, head_dim)
    groups = decode_groups(tables, lens, BLOCK_SIZE, torch.device("cpu"))
    results = {}
    for name, kernels in (("in place", FLOAT32_KERNELS), ("torch", None)):
        attention.native = kernels
        results[name] = torch.cat([attention._decode(0, q[g.start:g.end], pool, g) for g in groups]).double()
    error, torch_error = ((results[name] - expected).abs() for name in ("in place", "torch"))
    assert (error <= expected.abs() * 1e-5 + 1e-6).all()
    assert error.mean() <= torch_error.mean() * 1.5


@needs_float32_kernels
@pytest.mark.parametrize("length", [127, 128, 129, 700, 2049])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_one_long_float32_row_split_among_threads_equals_exact_attention(length, num_threads):
    """The float32 kernel's split of one long row among threads: within float32's rounding of exact attention."""
    generator = torch.Generator().manual_seed(length)
    pool = Pool(-(-length // BLOCK_SIZE) + 2, 3, 64, generator, torch.float32)
    table = scattered_tables([length], pool.keys[0].shape[0], seed=length)[0]
    q = torch.randn(1, 9, 64, generator=generator) * 2
    expected = exact(q[0], pool, table, length)[None]
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        got = FLOAT32_KERNELS.decode(q, pool.keys[0], pool.values[0], torch.tensor([table]), torch.tensor([length]),
                                     0.125)
    finally:
        torch.set_num_threads(before)
    assert ((got.double() - expected).abs() <= expected.abs() * 1e-5 + 1e-6).all()


@needs_float32_kernels
def test_float32_kernels_take_decode_rows_only_and_refuse_what_they_cannot_read():
    """A layer's whole call with decode rows and prefill chunks: the rows through the kernel, the
    chunks through torch (there is no float32 prefill kernel), outputs within float32 roundings of
    torch's path; a table too short for its context, or a block outside the pool, is refused."""
    pool, q, k, v, inputs = mixed_step(torch.float32)
    results = {}
    for name, kernels in (("in place", FLOAT32_KERNELS), ("torch", None)):
        attention = PagedAttention(*MIXED_HEADS)
        attention.native = kernels
        results[name] = attention(0, q, k, v, pool, inputs)
    torch.testing.assert_close(results["in place"], results["torch"], rtol=1e-5, atol=1e-6)
    assert torch.equal(results["in place"][2:], results["torch"][2:])  # the chunks: torch's own path
    assert FLOAT32_KERNELS.accepts(q, pool.keys[0]) and not FLOAT32_KERNELS.accepts(q, pool.keys[0], prefill=True)
    assert not FLOAT32_KERNELS.accepts(q.to(torch.bfloat16), pool.keys[0])
    for table, length in (([0, 1], 33), ([0, 64], 20), ([0, -1], 20)):
        with pytest.raises(ValueError, match="decode attention kernel refused its inputs"):
            FLOAT32_KERNELS.decode(q[:1], pool.keys[0], pool.values[0], torch.tensor([table]), torch.tensor([length]),
                                   0.125)


@pytest.mark.parametrize("broken", ["compiler fails", "cache not writable"])
def test_where_it_cannot_be_built_torch_attends_and_the_log_says_why(broken, monkeypatch, tmp_path, caplog):
    """Where the kernels cannot be built (a compiler that fails; a cache directory that cannot be
    made), loading says why and gives None: the worker's attention stays on torch's path."""
    if broken == "compiler fails":
        monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path))
        monkeypatch.setenv("CC", "false")
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with caplog.at_level(logging.INFO):
        assert NativeAttention.load() is None
    assert "torch's" in caplog.text
