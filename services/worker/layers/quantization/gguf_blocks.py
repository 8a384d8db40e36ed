"""GGUF block bytes read as `BlockCodes`, and rows of a quantized table de-quantized on demand.

`block_codes` reads a tensor's raw blocks (`[out, bytes_per_row]` uint8, as `gguf.GGUFReader` maps
them) into codes, scales and offsets without rounding anything: each block type's layout is a numpy
structured dtype, and the whole matrix is unpacked at once (no loop over blocks). The weights it
gives equal gguf-py's de-quantizer's, which follows llama.cpp's `dequantize_row_*`: the K-quants'
sub-block scale `d * sc` and minimum `dmin * m` are exact in float32 and are summed in the same
order. Scales and offsets stay factored as the file has them (`FactoredScales`: the K-quants' `d`
and `dmin` times each sub-block's integers). The symmetric types (Q4_0, Q5_0, Q8_0, Q6_K) write
`d * (q - 8)` as `d * q + (-8 * d)`: every product there is exact too, so the weights are the same
numbers, except that a zero weight under a negative scale is +0.0 here and -0.0 there (`x + (-x)` is
+0.0 in IEEE arithmetic).

`dequantized_rows` de-quantizes only the rows asked for (token embedding lookups), so no float copy
of a large table needs to be kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import gguf
import numpy as np
import torch

from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.factored_scales import FactoredScales

# a block's factor float32 [rows, blocks, 1] and its sub-blocks' integers [rows, blocks, sub-blocks per
# block] (None: the factor is the block's own scale or offset)
Factors = tuple[np.ndarray, np.ndarray | None]
# codes [rows, blocks, block_size] uint8, the scales' and the offsets' factors
Decoded = tuple[np.ndarray, Factors, Factors]
Decoder = Callable[[np.ndarray], Decoded]

_F16 = "<f2"


@dataclasses.dataclass(frozen=True)
class _BlockType:
    """One GGUF block type: its bytes as a numpy structured dtype and how they become codes."""

    name: str
    layout: np.dtype
    bits: int
    sub_block: int
    decode: Decoder


def _f32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32)


def _nibbles(packed: np.ndarray, run: int) -> np.ndarray:
    """Each run of `run` bytes gives `run` low nibbles, then `run` high ones (llama.cpp's order)."""
    runs = packed.reshape(*packed.shape[:-1], -1, 1, run)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=-2).reshape(*packed.shape[:-1], -1)


def _bit_fields(packed: np.ndarray, run: int, width: int) -> np.ndarray:
    """Each run of `run` bytes gives its lowest `width` bits, then the next `width`, ... (K-quants' high bits)."""
    shifts = np.arange(0, 8, width, dtype=np.uint8)[:, None]
    runs = packed.reshape(*packed.shape[:-1], -1, 1, run)
    return ((runs >> shifts) & ((1 << width) - 1)).reshape(*packed.shape[:-1], -1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes as 8 six-bit scales and 8 six-bit minimums (llama.cpp's `get_scale_min_k4`)."""
    low_scales, low_mins, high = np.split(packed.reshape(*packed.shape[:-1], 3, 4), 3, axis=-2)
    scales = np.concatenate([low_scales & 0x3F, (high & 0x0F) | ((low_scales >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([low_mins & 0x3F, (high >> 4) | ((low_mins >> 2) & 0x30)], axis=-1)
    return scales.reshape(*packed.shape[:-1], 8), mins.reshape(*packed.shape[:-1], 8)


def _own(values: np.ndarray) -> Factors:
    """A float16 per block, its own scale or offset."""
    return _f32(values)[..., None], None


def _symmetric(d: np.ndarray, zero_code: int) -> tuple[Factors, Factors]:
    """`d * (q - zero_code)` as a scale `d` and an offset `-zero_code * d` (exact: a power of two times d)."""
    scales = _f32(d)[..., None]
    return (scales, None), (np.float32(-zero_code) * scales, None)


def _q4_0(blocks: np.ndarray) -> Decoded:
    return (_nibbles(blocks["qs"], 16), *_symmetric(blocks["d"], 8))


def _q4_1(blocks: np.ndarray) -> Decoded:
    return _nibbles(blocks["qs"], 16), _own(blocks["d"]), _own(blocks["m"])


def _five_bits(blocks: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's codes: the nibbles, and bit j of the little-endian `qh` as code j's fifth bit."""
    high = np.unpackbits(blocks["qh"], axis=-1, bitorder="little")
    return _nibbles(blocks["qs"], 16) | (high << 4)


def _q5_0(blocks: np.ndarray) -> Decoded:
    return (_five_bits(blocks), *_symmetric(blocks["d"], 16))


def _q5_1(blocks: np.ndarray) -> Decoded:
    return _five_bits(blocks), _own(blocks["d"]), _own(blocks["m"])


def _q8_0(blocks: np.ndarray) -> Decoded:
    return (blocks["qs"] ^ np.uint8(0x80), *_symmetric(blocks["d"], 128))  # int8 q, as a byte, xor 0x80 is q + 128


def _k_scales_and_offsets(blocks: np.ndarray) -> tuple[Factors, Factors]:
    """Sub-block scale `d * sc` and offset `-dmin * m` (`-(dmin * m)`: negating is exact)."""
    scales, mins = _k_scales(blocks["scales"])
    return (_f32(blocks["d"])[..., None], scales), (-_f32(blocks["dmin"])[..., None], mins)


def _q4_k(blocks: np.ndarray) -> Decoded:
    return (_nibbles(blocks["qs"], 32), *_k_scales_and_offsets(blocks))


def _q5_k(blocks: np.ndarray) -> Decoded:
    codes = _nibbles(blocks["qs"], 32) | (_bit_fields(blocks["qh"], 32, 1) << 4)
    return (codes, *_k_scales_and_offsets(blocks))


def _q6_k(blocks: np.ndarray) -> Decoded:
    codes = _nibbles(blocks["ql"], 64) | (_bit_fields(blocks["qh"], 32, 2) << 4)
    d = _f32(blocks["d"])[..., None]  # times the int8 sub-block scales; the offsets -32 scales
    return codes, (d, blocks["scales"]), (np.float32(-32) * d, blocks["scales"])


_BLOCK_TYPES: dict[int, _BlockType] = {  # by ggml type id
    gguf.GGMLQuantizationType.Q4_0: _BlockType(
        "Q4_0", np.dtype([("d", _F16), ("qs", "u1", 16)]), 4, 32, _q4_0),
    gguf.GGMLQuantizationType.Q4_1: _BlockType(
        "Q4_1", np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", 16)]), 4, 32, _q4_1),
    gguf.GGMLQuantizationType.Q5_0: _BlockType(
        "Q5_0", np.dtype([("d", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]), 5, 32, _q5_0),
    gguf.GGMLQuantizationType.Q5_1: _BlockType(
        "Q5_1", np.dtype([("d", _F16), ("m", _F16), ("qh", "u1", 4), ("qs", "u1", 16)]), 5, 32, _q5_1),
    gguf.GGMLQuantizationType.Q8_0: _BlockType(
        "Q8_0", np.dtype([("d", _F16), ("qs", "u1", 32)]), 8, 32, _q8_0),
    gguf.GGMLQuantizationType.Q4_K: _BlockType(
        "Q4_K", np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", 128)]), 4, 32, _q4_k),
    gguf.GGMLQuantizationType.Q5_K: _BlockType(
        "Q5_K", np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]),
        5, 32, _q5_k),
    gguf.GGMLQuantizationType.Q6_K: _BlockType(
        "Q6_K", np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", _F16)]), 6, 16, _q6_k),
}

COVERED_TYPES: dict[int, str] = {int(kind): block_type.name for kind, block_type in _BLOCK_TYPES.items()}


def block_codes(ggml_type: int, data: np.ndarray, out_features: int, in_features: int) -> BlockCodes | None:
    """The tensor's blocks as `BlockCodes` (the same weights), or None for a type not in `COVERED_TYPES`.

    `data`: the tensor's bytes, uint8 `[out_features, bytes_per_row]` (any shape of that many bytes).
    """
    block_type = _BLOCK_TYPES.get(ggml_type)
    if block_type is None:
        return None
    blocks = _structured_blocks(block_type, data, out_features, in_features)
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN or infinite factor stays one, as in gguf-py
        codes, scales, offsets = block_type.decode(blocks)
    block_size = in_features // blocks.shape[1]
    return BlockCodes(torch.from_numpy(codes.reshape(out_features, in_features)), block_type.bits,
                      block_type.sub_block, _factored(scales, block_size, block_type.sub_block),
                      _factored(offsets, block_size, block_type.sub_block))


def _factored(factors: Factors, block_size: int, sub_block: int) -> FactoredScales:
    values, integers = factors
    rows = values.shape[0]
    if integers is None:
        return FactoredScales.plain(torch.from_numpy(values.reshape(rows, -1)), sub_block)
    return FactoredScales.of_integers(torch.from_numpy(values.reshape(rows, -1)),
                                      torch.from_numpy(integers.astype(np.int8).reshape(rows, -1)), block_size,
                                      sub_block)


def _structured_blocks(block_type: _BlockType, data: np.ndarray, out_features: int, in_features: int) -> np.ndarray:
    """`data` viewed as `[out_features, blocks per row]` records of the type's layout; ValueError
    naming the type and shape unless the bytes are exactly that many blocks."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[block_type.name]]
    assert block_type.layout.itemsize == type_size, block_type.name
    expected = out_features * (in_features // block_size) * type_size
    if in_features <= 0 or out_features <= 0 or in_features % block_size or data.nbytes != expected:
        raise ValueError(f"{block_type.name} tensor of {out_features}x{in_features}: needs inputs in multiples of "
                         f"{block_size} and {expected} bytes ({type_size} per block of {block_size}), "
                         f"got {data.nbytes} bytes shaped {list(data.shape)}")
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(out_features, -1)
    return raw.view(block_type.layout)


def dequantized_rows(ggml_type: int, data: np.ndarray, row_ids: Sequence[int] | np.ndarray | torch.Tensor,
                     ) -> torch.Tensor:
    """Rows `row_ids` of a table stored as `ggml_type` (`data` as `gguf.GGUFReader` maps it: `[rows, ...]`),
    float32 `[len(row_ids), in_features]`: only those rows' bytes are read and de-quantized."""
    kind = gguf.GGMLQuantizationType(ggml_type)
    ids = np.asarray(row_ids, dtype=np.int64).reshape(-1)
    num_rows = data.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        raise ValueError(f"row ids must lie in 0..{num_rows - 1} for this {kind.name} table, "
                         f"got {int(ids.min())}..{int(ids.max())}")
    in_features = gguf.quant_shape_from_byte_shape(data.shape, kind)[-1] if data.dtype == np.uint8 else data.shape[-1]
    if not ids.size:
        return torch.empty(0, in_features)
    unique_ids, inverse = np.unique(ids, return_inverse=True)  # a prompt repeats tokens: each row once
    rows = gguf.quants.dequantize(np.ascontiguousarray(data[unique_ids]), kind).reshape(len(unique_ids), in_features)
    return torch.from_numpy(np.ascontiguousarray(rows[inverse], dtype=np.float32))
