"""GGUF block products in C over `BlockCodes` of every kind (4, 5, 6, 8 bits; sub-blocks of 16 and
32) against exact integer arithmetic; their large-row path; Q8_0 rounding; the GGUF's head blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.worker.layers.block_helpers import (
    KIND_IDS,
    KINDS,
    assert_sum_of,
    block_codes,
    exact_terms,
    needs_kernel,
    rounded_rows,
)
from tests.worker.layers.test_quantized_linear import _weight, _write_gguf
from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.layers.quantization import block_linear
from ztgi.services.worker.layers.quantization.block_linear import (
    BLOCK_SIZE,
    LARGE_ROWS,
    BlockLinear,
    Int4BlockLinear,
    Int8BlockLinear,
    quantize_blocks,
)
from ztgi.services.worker.layers.quantization.quantized_linear import GgufWeights, quantize_int4

DTYPES = [torch.float32, torch.bfloat16]


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["offsets", "centered"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_product_equals_exact_block_arithmetic(kind, symmetric, rows, dtype):
    """Rows of activations rounded per block, integer sub-block sums, float32 scaling: the kernel
    equals that computed in float64 to float32's rounding of its sums (and bfloat16's of the result
    for bfloat16 rows), for every kind of codes, outputs that do not fill the last tile of 16 and
    row counts across the kernel's passes of 8."""
    codes = block_codes(*kind, 40, 96, symmetric, seed=rows)
    layer = BlockLinear.load(codes)
    assert layer.layout.center == ((1 << ((kind[2] or kind)[0] - 1)) if symmetric else 0)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
    x[0, :BLOCK_SIZE] = 0  # a block of zeros has no scale to divide by
    got = layer(x)
    assert got.shape == (rows, 40) and got.dtype == dtype
    assert_sum_of(got, exact_terms(x, codes, layer.layout.center))


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("rows", [1, 9, 17])
def test_float32_rows_at_one_level_equal_exact_block_arithmetic_and_stay_integer(kind, rows):
    """`float32_levels = 1` (the serving dtype where the CPU has no bfloat16 units): float32 rows
    rounded to one int8 level, as bfloat16's, then the same exact block arithmetic, float32 out; such
    a layer keeps the integer product for as many rows as bfloat16's (no AMX: any count)."""
    codes = block_codes(*kind, 40, 96, False, seed=rows)
    layer = BlockLinear.load(codes)
    layer.float32_levels = 1
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    got = layer(x)
    assert got.dtype == torch.float32
    assert_sum_of(got, exact_terms(x, codes, layer.layout.center, levels=1))
    assert layer.most_rows(torch.float32) == layer.most_rows(torch.bfloat16)
    layer.float32_levels = 2
    assert_sum_of(layer(x), exact_terms(x, codes, layer.layout.center, levels=2))


@needs_kernel
@pytest.mark.parametrize("out_features,in_features", [(16, 32), (100, 96), (1000, 576)])
def test_int8_layer_equals_exact_q8_0_arithmetic_and_rounds_rows_finely(out_features, in_features):
    """Q8_0 from int8 codes and scales: the exact block arithmetic, and the rounded rows within a part
    in 60000 of each block's largest input."""
    generator = torch.Generator().manual_seed(out_features)
    int8, scales = quantize_blocks(torch.randn(out_features, in_features, generator=generator))
    layer = Int8BlockLinear.load(int8, scales)
    x = torch.randn(9, in_features, generator=generator)
    combined, steps = rounded_rows(x)
    blocks = x.view(9, -1, BLOCK_SIZE)
    assert ((combined * steps[..., None] - blocks).abs() <= blocks.abs().amax(-1, keepdim=True) / 60000).all()
    codes = layer.layout.unpacked()
    assert torch.equal(codes.codes.to(torch.int16) - 128, int8.to(torch.int16)) and layer.layout.center == 128
    assert_sum_of(layer(x), exact_terms(x, codes, 128))


@needs_kernel
def test_int4_layer_takes_q4_1_blocks_as_given():
    """Q4_1 codes, scales and offsets (any float32, not only float16 values) as the weights they are."""
    groups = quantize_int4(_weight(40, 64), torch.float32)
    layer = Int4BlockLinear.load(groups.codes, groups.scales * (1 + 2**-20), groups.offsets)
    assert isinstance(layer, BlockLinear) and layer.bits == 4 and layer.sub_block == 32
    expected = (groups.codes.float().view(40, -1, 32) * (groups.scales * (1 + 2**-20))[..., None]
                + groups.offsets[..., None]).view(40, 64)
    assert torch.equal(layer.dequantized(), expected)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_product_into_a_column_slice_of_a_wider_output(dtype):
    """`product_into` writes its outputs into a slice of wider rows (fused layers' outputs side by
    side), the same values as the plain call, and nothing else of those rows."""
    layer = BlockLinear.load(block_codes(6, 16, None, 40, 96, False))
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    wide = torch.full((5, 72), float("nan"), dtype=dtype)
    assert layer.product_into(x, wide[:, 8:48]).data_ptr() == wide[:, 8:48].data_ptr()
    assert torch.equal(wide[:, 8:48], layer(x))
    assert wide[:, :8].isnan().all() and wide[:, 48:].isnan().all()
    with pytest.raises(ValueError, match="product_into"):
        layer.product_into(x, torch.empty(5, 40, 2, dtype=dtype)[..., 0])


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_large_row_calls_multiply_the_dequantized_weights(kind, dtype, monkeypatch):
    """Above `most_rows` rows (by its bits; bfloat16's on a CPU with AMX) the layer multiplies its weights
    de-quantized (into the shared scratch) with torch: x @ W.T to the dtype's rounding, rows not rounded."""
    monkeypatch.setattr(block_linear, "_has_amx", lambda: True)
    codes = block_codes(*kind, 40, 96, kind[0] == 8, seed=2)
    layer = BlockLinear.load(codes)
    assert layer.most_rows(dtype) == LARGE_ROWS[kind[0]]
    weights = codes.dequantized().double()
    for rows in (layer.most_rows(dtype) + 1, 3 * layer.most_rows(dtype)):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
        exact = x.double() @ weights.T
        tolerance = 2.0**-7 if dtype is torch.bfloat16 else 2.0**-20
        scale = x.double().abs() @ weights.abs().T
        assert ((layer(x).double() - exact).abs() <= tolerance * scale + 1e-12).all()
    assert torch.equal(layer(x), torch.mm(x, layer.dequantize(dtype).t()))


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_bfloat16_rows_without_amx_stay_on_the_integer_product(kind, monkeypatch):
    """Without AMX, bfloat16 rows take the integer product (one int8 level) at any count: it is faster
    than de-quantizing and torch's bfloat16 product there; float32 rows keep the crossover."""
    monkeypatch.setattr(block_linear, "_has_amx", lambda: False)
    codes = block_codes(*kind, 40, 96, kind[0] == 8, seed=4)
    layer = BlockLinear.load(codes)
    assert layer.most_rows(torch.float32) == LARGE_ROWS[kind[0]] and layer.most_rows(torch.bfloat16) > 10**9
    x = torch.randn(3 * LARGE_ROWS[kind[0]], 96, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert_sum_of(layer(x), exact_terms(x, codes, layer.layout.center))


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_dequantize_in_c_gives_the_weights(kind):
    """The C de-quantizing (the large-row path's) gives the codes' weights: float32 to one rounding
    (it fuses the multiply and add), bfloat16 as those rounded."""
    codes = block_codes(*kind, 40, 96, False, seed=3)
    layer = BlockLinear.load(codes)
    weights = codes.dequantized()
    torch.testing.assert_close(layer.dequantize(torch.float32), weights, rtol=2.0**-23, atol=1e-7)
    torch.testing.assert_close(layer.dequantize(torch.bfloat16).float(), weights, rtol=2.0**-8, atol=1e-7)
    with pytest.raises(ValueError, match="dequantize"):
        layer.dequantize(torch.float16)


@needs_kernel
def test_layer_keeps_the_input_shape_and_dtype():
    """3-d, 2-d and bfloat16 inputs; the short path for a step's 2-d bfloat16 rows computes the same;
    float32 rows (two levels) differ from bfloat16's (one) by at most 8-bit rows' rounding."""
    layer = Int8BlockLinear.load(*quantize_blocks(_weight(48, 64)))
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    weights = layer.dequantized().float()
    rounding = weights.abs() @ x[1, 2].float().view(-1, BLOCK_SIZE).abs().amax(-1).repeat_interleave(BLOCK_SIZE) / 254
    difference = (y[1, 2].float() - layer(x[1, 2:3].float())[0]).abs()
    assert (difference <= rounding * 1.01 + y[1, 2].float().abs() * 2.0**-8).all()
    assert torch.equal(layer(x[1]), y[1])
    assert layer(x.double()).dtype == torch.float64


@needs_kernel
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_no_rows_give_an_empty_product(kind):
    """A step with no row to compute (a prefill chunk whose logits nobody needs) gets `[0, out]`, not an error."""
    layer = BlockLinear.load(block_codes(*kind, 48, 64, False))
    for x in (torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(0, 64), torch.empty(2, 0, 64)):
        y = layer(x)
        assert y.shape == (*x.shape[:-1], 48) and y.dtype == x.dtype


def test_inputs_not_in_whole_blocks_get_no_layer():
    """Sub-blocks of 16 over 48 inputs are BlockCodes, but not whole VNNI blocks of 32: no layer (torch's path)."""
    assert BlockLinear.load(block_codes(6, 16, None, 16, 48, False)) is None


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


@pytest.mark.skipif(not set(block_linear.AVX2_FLAGS) <= native_library.cpu_flags(), reason="no AVX2 CPU here")
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["offsets", "centered"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_avx2_twin_gives_the_same_outputs(kind, symmetric, dtype):
    """`block_linear_avx2.c` (what a CPU without AVX512 runs) gives exactly the outputs and weights of
    the library this CPU runs by default (`block_linear.c` on an AVX512-VNNI CPU, where the twin is
    otherwise never run), with offsets and centers, partial tiles and passes of rows."""
    twin = block_linear.kernels_of(native_library.load("block_linear_avx2.c", block_linear.AVX2_FLAGS))
    codes = block_codes(*kind, 40, 96, symmetric, seed=5)
    default, avx2 = BlockLinear.load(codes), BlockLinear(codes, twin)
    if default is None:
        pytest.skip("no C compiler here")
    x = torch.randn(11, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    assert torch.equal(avx2(x), default(x))
    assert torch.equal(avx2(x[:1]), default(x[:1]))
    for weights in (torch.float32, torch.bfloat16):
        assert torch.equal(avx2.dequantize(weights), default.dequantize(weights))
