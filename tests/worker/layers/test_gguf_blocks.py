"""GGUF block bytes read as BlockCodes for the covered types, equal to gguf-py's de-quantizer; rows on demand."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.worker.layers.gguf_files import (
    LLAMA_CPP_BUILD,
    Q,
    llama_cpp_dequantize,
    llama_cpp_library,
    llama_cpp_quantize,
    random_blocks,
    write_each_type,
)
from ztgi.services.worker.layers.quantization.gguf_blocks import COVERED_TYPES, block_codes, dequantized_rows

COVERED = [Q(kind) for kind in COVERED_TYPES]
UNCOVERED = [Q.Q2_K, Q.Q3_K, Q.IQ4_XS, Q.F16, Q.F32, Q.BF16]
# `d * (q - z)` written as `d * q + (-z * d)`: the same number, but +0.0 where gguf-py has -0.0 (d < 0, q == z)
SYMMETRIC = {Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q6_K}
BITS = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8, Q.Q4_K: 4, Q.Q5_K: 5, Q.Q6_K: 6}
OUT_FEATURES, IN_FEATURES = 6, 3 * 256  # three super-blocks (24 blocks of 32) per row


def _assert_same_weights(kind: Q, got: torch.Tensor, expected: np.ndarray) -> None:
    """Bit for bit; for the symmetric types up to the sign of zero (`x + 0.0` maps -0.0 to +0.0 only)."""
    got_array = got.numpy()
    assert got_array.dtype == np.float32 and got_array.shape == expected.shape
    if kind in SYMMETRIC:
        got_array, expected = got_array + np.float32(0), expected + np.float32(0)
    assert np.array_equal(got_array.view(np.int32), expected.view(np.int32)), kind.name


def _shape_of_blocks(kind: Q, codes_bits: int, sub_block: int) -> None:
    assert codes_bits == BITS[kind]
    assert sub_block == (16 if kind == Q.Q6_K else 32)


@pytest.mark.parametrize("kind", COVERED, ids=lambda kind: kind.name)
def test_random_blocks_equal_gguf_dequantize(kind):
    """Random blocks (edge float16 factors included) read into codes below 2**bits whose weights are
    gguf-py's de-quantized weights, bit for bit (symmetric types: up to the sign of zero)."""
    data = random_blocks(kind, OUT_FEATURES, IN_FEATURES, seed=int(kind))
    codes = block_codes(int(kind), data, OUT_FEATURES, IN_FEATURES)
    assert codes is not None
    _shape_of_blocks(kind, codes.bits, codes.sub_block)
    assert codes.codes.dtype == torch.uint8 and int(codes.codes.max()) < 2 ** codes.bits
    assert codes.scales.dtype == torch.float32 and codes.offsets.dtype == torch.float32
    _assert_same_weights(kind, codes.dequantized(), gguf.quants.dequantize(data, kind))


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0], ids=lambda kind: kind.name)
def test_quantized_weights_equal_gguf_dequantize(kind):
    """Weights quantized by gguf-py itself come back as the weights its de-quantizer gives."""
    weights = np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32)
    data = gguf.quants.quantize(weights, kind)
    codes = block_codes(int(kind), data, 16, 256)
    assert codes is not None
    _assert_same_weights(kind, codes.dequantized(), gguf.quants.dequantize(data, kind))


@pytest.mark.skipif(llama_cpp_library() is None, reason=f"no llama.cpp build at {LLAMA_CPP_BUILD}")
@pytest.mark.parametrize("kind", COVERED, ids=lambda kind: kind.name)
def test_llama_cpp_blocks_equal_llama_cpp_dequantize(kind):
    """Blocks llama.cpp's own quantizer writes (K-quants included, negative Q6_K scales among them)
    give the weights llama.cpp's own `dequantize_row_*` gives (symmetric types: up to the sign of zero)."""
    rng = np.random.default_rng(4)
    weights = rng.standard_normal((32, 1024)) * 0.02 + rng.standard_normal((32, 1)) * 0.01  # rows off zero
    data = llama_cpp_quantize(kind, weights)
    codes = block_codes(int(kind), data, 32, 1024)
    assert codes is not None
    _assert_same_weights(kind, codes.dequantized(), llama_cpp_dequantize(kind, data))


def test_every_code_value_is_read():
    """Each byte value in every Q8_0 position gives its own code (q + 128), all 256 of them."""
    data = random_blocks(Q.Q8_0, 256, 32)
    data[:, 2:] = np.arange(256, dtype=np.uint8)[:, None]  # row r holds the signed byte r everywhere
    codes = block_codes(int(Q.Q8_0), data, 256, 32)
    assert codes is not None
    assert torch.equal(codes.codes[:, 0].long(), (torch.arange(256) + 128) % 256)


@pytest.mark.parametrize("kind", UNCOVERED, ids=lambda kind: kind.name)
def test_uncovered_types_are_none(kind):
    """A type outside COVERED_TYPES gives None (the caller de-quantizes it), whatever its bytes."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    data = np.zeros((4, 256 // block_size * type_size), dtype=np.uint8)
    assert kind not in COVERED_TYPES
    assert block_codes(int(kind), data, 4, 256) is None


def test_covered_types_are_named():
    """COVERED_TYPES names the eight types by ggml type id."""
    assert COVERED_TYPES == {int(kind): kind.name for kind in BITS}


@pytest.mark.parametrize(("kind", "out_features", "in_features", "num_bytes"), [
    (Q.Q4_K, 4, 512, 4 * 288 - 1),  # truncated
    (Q.Q4_K, 4, 512, 4 * 288 + 144),  # a block too many
    (Q.Q4_K, 4, 384, 4 * 288),  # inputs not a multiple of 256
    (Q.Q8_0, 2, 48, 2 * 34),  # inputs not a multiple of 32
    (Q.Q6_K, 0, 256, 0),  # no rows
])
def test_bad_byte_counts_name_type_and_shape(kind, out_features, in_features, num_bytes):
    """Bytes that are not exactly the tensor's blocks: ValueError naming the type and the shape."""
    data = np.zeros(num_bytes, dtype=np.uint8)
    with pytest.raises(ValueError, match=f"{kind.name} tensor of {out_features}x{in_features}"):
        block_codes(int(kind), data, out_features, in_features)


@pytest.mark.parametrize("kind", COVERED + UNCOVERED, ids=lambda kind: kind.name)
def test_dequantized_rows_are_the_full_tables_rows(kind):
    """Rows picked in any order, repeated, as a list or a tensor, equal those rows of the whole
    table de-quantized; no ids give no rows."""
    if kind in (Q.F16, Q.F32, Q.BF16):  # as GGUFReader maps them: float16, float32, BF16's bytes
        data = gguf.quants.quantize(np.random.default_rng(2).standard_normal((10, 256)).astype(np.float32), kind)
    else:
        data = random_blocks(kind, 10, 256, seed=3)
    table = torch.from_numpy(gguf.quants.dequantize(data, kind).reshape(10, 256))
    ids = [7, 0, 7, 9, 3]
    assert torch.equal(dequantized_rows(int(kind), data, ids), table[ids])
    assert torch.equal(dequantized_rows(int(kind), data, torch.tensor([[2], [2]])), table[[2, 2]])
    assert dequantized_rows(int(kind), data, []).shape == (0, 256)


@pytest.mark.parametrize("ids", [[10], [-1], [0, 12]])
def test_dequantized_rows_out_of_range_is_value_error(ids):
    """A row id outside the table: ValueError naming the type and the valid range."""
    with pytest.raises(ValueError, match=r"0\.\.9 for this Q4_K table"):
        dequantized_rows(int(Q.Q4_K), random_blocks(Q.Q4_K, 10, 256), ids)


def test_gguf_file_tensors_read_back_as_block_codes(tmp_path):
    """A real GGUF file with a tensor of each covered type: GGUFReader's mapped bytes give BlockCodes
    equal to gguf-py's de-quantization of the bytes written."""
    path = str(tmp_path / "covered.gguf")
    written = write_each_type(path, COVERED, out_features=4, in_features=512)
    reader = gguf.GGUFReader(path)
    assert sorted(tensor.name for tensor in reader.tensors) == sorted(written)
    for tensor in reader.tensors:
        kind, data = written[tensor.name]
        in_features, out_features = (int(size) for size in tensor.shape)  # ggml order: inputs first
        codes = block_codes(int(tensor.tensor_type), tensor.data, out_features, in_features)
        assert codes is not None, tensor.name
        _assert_same_weights(kind, codes.dequantized(), gguf.quants.dequantize(data, kind))
