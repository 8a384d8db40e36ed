"""GGUF blocks of every covered type in the kernel with their scales factored as the file stores
them: the same weights bit for bit, the exact block arithmetic, about the file's bits per weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.worker.layers.block_helpers import assert_sum_of, exact_terms, needs_kernel
from tests.worker.layers.gguf_files import Q, random_blocks
from ztgi.services.worker.layers.quantization import block_linear
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_layout import BlockLayout
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.layers.quantization.factored_scales import FactoredScales
from ztgi.services.worker.layers.quantization.gguf_blocks import COVERED_TYPES, block_codes

COVERED = [Q(kind) for kind in COVERED_TYPES]
K_QUANTS = {Q.Q4_K, Q.Q5_K, Q.Q6_K}
# the file's bits per weight, and what the kernel may read beyond it (a factor per 16 outputs' tile
# is float16 as stored; Q4_1's and Q5_1's minimum and the K-quants' integers are one byte a sub-block)
FILE_BITS = {Q.Q4_0: 4.5, Q.Q4_1: 5.0, Q.Q5_0: 5.5, Q.Q5_1: 6.0, Q.Q8_0: 8.5, Q.Q4_K: 4.5, Q.Q5_K: 5.5,
             Q.Q6_K: 6.5625}
OUT_FEATURES, IN_FEATURES = 37, 512  # outputs that do not fill the last tile of 16


def _codes(kind: Q, out_features: int = OUT_FEATURES, seed: int = 0) -> BlockCodes:
    data = random_blocks(kind, out_features, IN_FEATURES, seed=seed + int(kind))
    codes = block_codes(int(kind), data, out_features, IN_FEATURES)
    assert codes is not None
    return codes


def _bits_per_weight(layer: BlockLinear) -> float:
    return 8 * layer.layout.nbytes / (layer.out_features * layer.in_features)


@needs_kernel
@pytest.mark.parametrize("kind", COVERED, ids=lambda kind: kind.name)
def test_every_type_keeps_its_weights_in_about_its_file_bits(kind):
    """Packed with float16 factors (and int8 integers for the K-quants), read back and de-quantized
    in C: the codes' weights bit for bit, within 0.3 bits per weight of the file's (whole tiles)."""
    codes = _codes(kind, out_features=64)
    layer = BlockLinear.load(codes)
    assert layer is not None
    layout = layer.layout
    assert (layout.scale_integers.numel() > 0) == (kind in K_QUANTS)
    assert layout.super_block == (256 if kind in K_QUANTS else 32)
    expected = codes.dequantized()
    assert torch.equal(layer.dequantized(), expected)
    assert torch.equal(layer.dequantize(torch.float32).view(torch.int32), expected.view(torch.int32))
    assert _bits_per_weight(layer) <= FILE_BITS[kind] + 0.3


@needs_kernel
@pytest.mark.parametrize("kind", COVERED, ids=lambda kind: kind.name)
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_product_of_every_type_equals_exact_block_arithmetic(kind, rows, dtype):
    """The scales formed from factors and integers in the kernel are the floats the file means: the
    product equals the exact block arithmetic over `BlockCodes`' float scales; no rows, no outputs."""
    codes = _codes(kind, seed=rows)
    layer = BlockLinear.load(codes)
    assert layer is not None
    x = torch.randn(rows, IN_FEATURES, generator=torch.Generator().manual_seed(rows)).to(dtype)
    got = layer(x)
    assert got.shape == (rows, OUT_FEATURES) and got.dtype == dtype
    assert_sum_of(got, exact_terms(x, codes, layer.layout.center))
    assert layer(x[:0]).shape == (0, OUT_FEATURES)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_large_row_calls_of_a_k_quant_multiply_its_exact_weights(dtype, monkeypatch):
    """Above `most_rows` the factored Q4_K weights de-quantized in C (the scratch) are the codes'."""
    monkeypatch.setattr(block_linear, "_has_amx", lambda: True)  # bfloat16's crossover is AMX's
    codes = _codes(Q.Q4_K)
    layer = BlockLinear.load(codes)
    assert layer is not None
    x = torch.randn(layer.most_rows(dtype) + 1, IN_FEATURES, generator=torch.Generator().manual_seed(5)).to(dtype)
    assert torch.equal(layer(x), torch.mm(x, codes.dequantized().to(dtype).t()))


@needs_kernel
def test_q4_k_m_attention_fuses_factored_and_overflow_falls_back_to_float32():
    """q and k in Q4_K beside a Q6_K v fuse into one factored matrix (6-bit codes, sub-blocks of 16)
    with the same weights; where a factor (v's offset, -32 d of d = 65504) is no float16 the
    factors are float32, still exact."""
    q, k, v = _codes(Q.Q4_K, 32, seed=1), _codes(Q.Q4_K, 16, seed=2), _codes(Q.Q6_K, 16, seed=3)
    fused = BlockCodes.concat([q, k, v])
    assert fused.factored_scales.integers is not None and fused.factored_scales.super_block == 256
    assert torch.equal(fused.dequantized(), torch.cat([q.dequantized(), k.dequantized(), v.dequantized()]))
    layer = BlockLinear.load(fused)
    assert layer is not None and layer.bits == 6 and layer.sub_block == 16
    assert layer.layout.scale_factors.dtype == torch.float32  # v's d includes 65504 (random_blocks' edges)
    assert torch.equal(layer.dequantize(torch.float32), fused.dequantized())
    x = torch.randn(3, IN_FEATURES, generator=torch.Generator().manual_seed(0))
    assert_sum_of(layer(x), exact_terms(x, fused, layer.layout.center))
    assert BlockLayout.pack(BlockCodes.concat([q, k])).scale_factors.dtype == torch.float16


def test_mixed_super_blocks_fuse_as_plain_scales():
    """A Q8_0 part (no integers) beside a Q4_K part stacks as plain float32 scales, the same weights."""
    parts = [_codes(Q.Q4_K, 16), _codes(Q.Q8_0, 16)]
    fused = BlockCodes.concat(parts)
    assert fused.factored_scales.integers is None and fused.bits == 8
    assert torch.equal(fused.dequantized(), torch.cat([p.dequantized() for p in parts]))


def test_integers_out_of_int8_range_are_refused():
    with pytest.raises(ValueError, match="-128..127"):
        FactoredScales.of_integers(torch.ones(2, 1), torch.full((2, 8), 200), 256, 32)
    with pytest.raises(ValueError, match="super-blocks"):
        FactoredScales(torch.ones(2, 8), None, 256, 32)
    assert np.isclose(FactoredScales.of_integers(torch.full((1, 1), 0.5), torch.arange(-4, 4).view(1, 8), 256, 32)
                      .values().numpy(), np.arange(-4, 4) / 2).all()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_parts_of_different_kinds_stack_each_as_stored(dtype, monkeypatch):
    """Q4_K q and k beside a Q6_K v: one layer of two packed parts (q and k as one 4-bit matrix, v
    6-bit), no code widened; one call gives each part's exact block arithmetic in its columns, also
    into a slice of wider rows; de-quantized (and above `most_rows`) the parts' weights stacked."""
    monkeypatch.setattr(block_linear, "_has_amx", lambda: True)  # bfloat16's crossover is AMX's
    q, k, v = _codes(Q.Q4_K, 32, seed=1), _codes(Q.Q4_K, 16, seed=2), _codes(Q.Q6_K, 21, seed=3)
    layer = BlockLinear.load_stacked([q, k, v])
    assert layer is not None and [lay.bits for lay in layer.layouts] == [4, 6] and layer.out_features == 69
    assert layer.nbytes == sum(BlockLayout.pack(c).nbytes for c in (BlockCodes.concat([q, k]), v))
    with pytest.raises(ValueError, match="layouts"):
        _ = layer.layout
    weights = torch.cat([q.dequantized(), k.dequantized(), v.dequantized()])
    assert torch.equal(layer.dequantized(), weights)
    assert torch.equal(layer.dequantize(torch.float32), weights)
    for rows in (1, 17):
        x = torch.randn(rows, IN_FEATURES, generator=torch.Generator().manual_seed(rows)).to(dtype)
        wide = torch.full((rows, 80), float("nan"), dtype=dtype)
        got = layer.product_into(x, wide[:, 4:73])
        for part, columns in ((q, slice(0, 32)), (k, slice(32, 48)), (v, slice(48, 69))):
            assert_sum_of(got[:, columns], exact_terms(x, part, BlockLayout.pack(part).center))
        assert wide[:, :4].isnan().all() and wide[:, 73:].isnan().all()
    x = torch.randn(layer.most_rows(dtype) + 1, IN_FEATURES, generator=torch.Generator().manual_seed(9)).to(dtype)
    assert torch.equal(layer(x), torch.mm(x, weights.to(dtype).t()))


@needs_kernel
def test_parts_of_one_kind_stack_into_one_matrix():
    """gate and up, both Q4_K: one packed matrix, as `BlockCodes.concat` gives."""
    gate, up = _codes(Q.Q4_K, 16, seed=4), _codes(Q.Q4_K, 32, seed=5)
    layer = BlockLinear.load_stacked([gate, up])
    assert layer is not None and len(layer.layouts) == 1
    assert torch.equal(layer.dequantized(), BlockCodes.concat([gate, up]).dequantized())


@needs_kernel
def test_parts_of_different_input_sizes_are_refused():
    wide = BlockCodes.plain(torch.zeros(16, 64, dtype=torch.uint8), 4, 32, torch.ones(16, 2), torch.zeros(16, 2))
    with pytest.raises(ValueError, match="one input size"):
        BlockLinear.load_stacked([_codes(Q.Q4_0, 16), wide])
