"""GGUF block products in C (Q8_0, Q4_1) against exact integer arithmetic; Q8_0 rounding; the GGUF's head blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.worker.layers.test_quantized_linear import _weight, _write_gguf
from ztgi.services.worker.layers.quantization.block_linear import (
    BLOCK_SIZE,
    Int4BlockLinear,
    Int8BlockLinear,
    quantize_blocks,
)
from ztgi.services.worker.layers.quantization.quantized_linear import GgufWeights, quantize_int4

needs_kernel = pytest.mark.skipif(Int8BlockLinear.load(*quantize_blocks(torch.ones(16, 32))) is None,
                                  reason="no AVX512-VNNI CPU or no C compiler here")


def rounded_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x's rows as the kernels round them: per block of 32, int8 codes c1 in steps of the block's
    largest magnitude over 127 and c2 for what is left in steps 254 times finer. Returns the
    combined codes 254 c1 + c2 and the fine step per block."""
    blocks = x.float().view(x.shape[0], -1, BLOCK_SIZE)
    largest = blocks.abs().amax(dim=-1)
    # a true division, as the kernel's (torch's `127 / t` is 127 times a rounded reciprocal)
    inverse = torch.where(largest > 0, torch.full_like(largest, 127).div(largest), torch.zeros_like(largest))
    first = torch.round(blocks * inverse[..., None])
    left = (blocks.double() * inverse.double()[..., None] - first).float()  # from the exact product, as FMA
    second = torch.round(left * 254)
    return first * 254 + second, largest / 127 / 254


def assert_float32_sum_of(got: torch.Tensor, terms: torch.Tensor) -> None:
    """`got` `[rows, out]` is the sum of the float64 terms `[rows, out, terms]` to float32's rounding:
    a few roundings per term (int to float, the scales), one per addition."""
    bound = terms.abs().sum(-1) * (terms.shape[-1] + 4) * 2.0**-24
    assert ((got.double() - terms.sum(-1)).abs() <= bound + 1e-30).all()


def exact_terms(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The Q8_0 product's block terms in float64 `[rows, out, blocks]`: each block's integer dot
    product times the weight block's scale and the row block's step."""
    x_codes, x_scales = rounded_rows(x)
    dots = torch.einsum("rbk,obk->rob", x_codes.double(), codes.view(codes.shape[0], -1, BLOCK_SIZE).double())
    return dots * x_scales.double()[:, None, :] * scales.double()[None]


@needs_kernel
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (40, 64), (100, 96), (1000, 576)])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_product_equals_exact_block_arithmetic(out_features, in_features, rows):
    """Rows of activations rounded per block, integer block sums, float32 scaling: the kernel equals
    that computed in float64 to float32's rounding of its sums, for outputs that do not fill the last tile of
    16 and for row counts across the kernel's passes of 8; and the rounded rows are within a
    part in 60000 of each block's largest input."""
    generator = torch.Generator().manual_seed(out_features * rows)
    codes, scales = quantize_blocks(torch.randn(out_features, in_features, generator=generator))
    layer = Int8BlockLinear.load(codes, scales)
    x = torch.randn(rows, in_features, generator=generator)
    x[0, :BLOCK_SIZE] = 0  # a block of zeros has no scale to divide by
    combined, steps = rounded_rows(x)
    assert ((combined * steps[..., None] - x.view(rows, -1, BLOCK_SIZE)).abs()
            <= x.view(rows, -1, BLOCK_SIZE).abs().amax(-1, keepdim=True) / 60000 + 1e-12).all()
    got = layer(x)
    assert got.shape == (rows, out_features)
    assert_float32_sum_of(got, exact_terms(x, codes, scales))


@needs_kernel
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (40, 64), (960, 576)])
@pytest.mark.parametrize("rows", [1, 8, 9])
def test_int4_product_equals_exact_block_arithmetic(out_features, in_features, rows):
    """Q4_1: per block, scale x (the codes' dot with x's rounded row) + offset x (the sum of x's
    codes), times x's block step; the kernel equals that computed in float64 to float32's rounding."""
    generator = torch.Generator().manual_seed(out_features + rows)
    groups = quantize_int4(torch.randn(out_features, in_features, generator=generator), torch.float16)
    layer = Int4BlockLinear.load(groups.codes, groups.scales, groups.offsets)
    assert torch.equal(layer.dequantized(), groups.dequantized())
    x = torch.randn(rows, in_features, generator=generator)
    x_codes, x_scales = rounded_rows(x)
    codes = groups.codes.view(out_features, -1, BLOCK_SIZE).double()
    dots = torch.einsum("rbk,obk->rob", x_codes.double(), codes) * groups.scales.double()[None]
    offset_terms = groups.offsets.double()[None] * x_codes.double().sum(-1)[:, None, :]
    assert_float32_sum_of(layer(x), torch.cat([dots, offset_terms], -1) * x_scales.double().repeat(1, 2)[:, None, :])


@needs_kernel
def test_int4_layer_takes_only_float16_block_scales():
    """The kernel reads float16 scales and offsets, as GGUF stores them: others are refused (None), not rounded."""
    groups = quantize_int4(_weight(16, 64), torch.float32)
    assert Int4BlockLinear.load(groups.codes, groups.scales * (1 + 2**-20), groups.offsets) is None


@needs_kernel
def test_layer_keeps_the_input_shape_and_dtype_and_its_weights():
    """3-d, 2-d and bfloat16 inputs; the packed weights de-quantize to exactly codes times scales."""
    codes, scales = quantize_blocks(_weight(48, 64))
    layer = Int8BlockLinear.load(codes, scales)
    expected = (codes.float().view(48, -1, BLOCK_SIZE) * scales[..., None]).view(48, 64)
    assert torch.equal(layer.dequantized(), expected)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y[1, 2].float(), layer(x[1, 2:3].float())[0].to(torch.bfloat16).float())
    assert torch.equal(layer(x[1]), y[1])  # a step's 2-d bfloat16 rows take the short path: the same products


@needs_kernel
def test_no_rows_give_an_empty_product():
    """A step with no row to compute (a prefill chunk whose logits nobody needs) gets `[0, out]`, not an error."""
    int8 = Int8BlockLinear.load(*quantize_blocks(_weight(48, 64)))
    groups = quantize_int4(_weight(48, 64), torch.float16)
    int4 = Int4BlockLinear.load(groups.codes, groups.scales, groups.offsets)
    for layer in (int8, int4):
        for x in (torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, 64), torch.empty(2, 0, 64)):
            y = layer(x)
            assert y.shape == (*x.shape[:-1], 48) and y.dtype == x.dtype


def test_quantize_blocks_is_q8_0_rounding():
    """Each weight within half a step of its block's scale; the scales are float16 values."""
    weight = _weight(32, 128)
    codes, scales = quantize_blocks(weight)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127 and scales.shape == (32, 4)
    assert torch.equal(scales, scales.to(torch.float16).float())
    steps = scales.repeat_interleave(BLOCK_SIZE, dim=1)
    restored = codes.float() * steps
    assert bool(((restored - weight).abs() <= steps / 2 + 1e-6).all())


def test_gguf_q8_0_output_blocks_are_taken_as_stored(tmp_path):
    """The output matrix's Q8_0 blocks read into codes and scales that de-quantize to gguf-py's
    own result: `output.weight` where the file has one, the token embedding where the model ties
    them; not the embedding of an untied model, nor another type or shape."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    rng = np.random.RandomState(0)
    embedding, output = rng.randn(48, 64).astype(np.float32), rng.randn(48, 64).astype(np.float32)
    tied_path, untied_path = str(tmp_path / "tied.gguf"), str(tmp_path / "untied.gguf")
    _write_gguf(tied_path, {"token_embd.weight": (embedding, kinds.Q8_0)})
    _write_gguf(untied_path, {"token_embd.weight": (embedding, kinds.Q8_0), "output.weight": (output, kinds.Q4_1)})

    def reference(weight: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weight, kinds.Q8_0), kinds.Q8_0))

    codes, scales = GgufWeights(tied_path, 4, 2, tied=True).output_blocks(torch.Size([48, 64]))
    assert torch.equal((codes.float().view(48, -1, BLOCK_SIZE) * scales[..., None]).view(48, 64),
                       reference(embedding))
    assert GgufWeights(tied_path, 4, 2, tied=False).output_blocks(torch.Size([48, 64])) is None
    assert GgufWeights(tied_path, 4, 2, tied=True).output_blocks(torch.Size([64, 48])) is None
    assert GgufWeights(untied_path, 4, 2, tied=False).output_blocks(torch.Size([48, 64])) is None


def test_embedded_gguf_head_blocks_equal_the_converted_float_weights(smollm2, smollm2_reference):
    """SmolLM2's Q8_0 token embedding (its lm_head, tied), read as codes and block scales, equals the
    float matrix transformers de-quantized from it, bit for bit."""
    config = smollm2_reference.config
    source = GgufWeights(smollm2.gguf_file, config.num_attention_heads, config.num_key_value_heads, tied=True)
    head = smollm2_reference.lm_head.weight.detach()
    codes, scales = source.output_blocks(head.shape)
    assert torch.equal((codes.float().view(head.shape[0], -1, BLOCK_SIZE) * scales[..., None]).view(head.shape),
                       head)
