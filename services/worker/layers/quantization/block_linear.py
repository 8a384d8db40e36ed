"""Linear layers in GGUF's block formats, multiplied in C with integer dot products: Q8_0 and Q4_1/Q4_0.

A decode step of a few rows reads every weight once for a few operations each, so its time is the
weights' bytes and how fast the products consume them. torch's CPU int4 kernel widens the 4-bit
weights to bfloat16 and multiplies in float. llama.cpp instead rounds each activation row to int8
per block of 32 inputs and sums each block's products exactly in int32 with the CPU's VNNI dot
products, several times the multiplies per instruction. `kernels/csrc/block_linear.c` does the same with
finer activations: what the int8 rounding leaves is rounded again to int8 in steps 254 times
finer, so each row keeps about 16 bits per block (with 8-bit rows, as llama.cpp's, 28% of greedy
requests kept float weights' text against 52%; BENCHMARKS.md "Quantized weights"), for a second
VNNI product per block that costs little where the weights' bytes are the time.

- `Int4BlockLinear`: `--quantize int4`'s decoder blocks, from the GGUF's own Q4_1/Q4_0 blocks
  (4-bit codes, a float16 scale and offset per 32 inputs) or rounded from float weights.
- `Int8BlockLinear`: the lm_head in both quantized modes, the GGUF's Q8_0 blocks where the file
  has them (SmolLM2's tied token embedding), else rounded here (`quantize_blocks`).

Both need a CPU with AVX512-VNNI and AVX512-BF16 and a C compiler (`native_library`); elsewhere
`load` returns None and the caller keeps torch's layers.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import INT, INT64, POINTER, Kernel

BLOCK_SIZE = 32
TILE = 16  # outputs side by side in one VNNI operand
GROUPS = BLOCK_SIZE // 4  # four inputs per VNNI lane
INT8_MAX = 127
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")


@functools.cache
def _library() -> ctypes.CDLL | None:
    return native_library.load_or_none("block_linear.c", "quantized products", CPU_FLAGS)


def _kernel(name: str, weight_buffers: int) -> Kernel | None:
    library = _library()
    if library is None:
        return None
    return native_library.bind(library, name, [POINTER, INT, INT64, INT64, *[POINTER] * weight_buffers, INT64,
                                               POINTER, INT])


def quantize_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0's rounding: per block of 32 inputs a scale of its largest magnitude over 127 (rounded to
    float16, as the file stores it) and int8 codes. Returns codes `[out, in]` and scales `[out, in / 32]`."""
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    blocks = weight.view(out_features, -1, BLOCK_SIZE)
    scales = (blocks.abs().amax(dim=-1) / INT8_MAX).to(torch.float16).float()
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(blocks / safe[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes.view(out_features, in_features), scales


def _tiled(values: torch.Tensor, tiles: int, fill: int | float = 0) -> torch.Tensor:
    """`[out, ...]` padded with `fill` to whole tiles of 16 outputs: `[tiles, 16, ...]`."""
    padded = torch.full((tiles * TILE, *values.shape[1:]), fill, dtype=values.dtype)
    padded[:values.shape[0]] = values
    return padded.view(tiles, TILE, *values.shape[1:])


def _tiled_scales(scales: torch.Tensor, tiles: int) -> torch.Tensor:
    """`[out, blocks]` -> float16 `[tiles, blocks, 16]`: one vector per tile and block."""
    return _tiled(scales.float(), tiles).transpose(1, 2).to(torch.float16).contiguous()


class BlockLinear:
    """`y = x @ W.T` by one of `kernels/csrc/block_linear.c`'s products over this layer's packed buffers."""

    def __init__(self, out_features: int, in_features: int, kernel: Kernel, buffers: tuple[torch.Tensor, ...]) -> None:
        if in_features % BLOCK_SIZE:
            raise ValueError(f"block formats need a multiple of {BLOCK_SIZE} inputs, not {in_features}")
        self.out_features, self.in_features = out_features, in_features
        self._kernel, self._buffers = kernel, buffers
        self._pointers = [buffer.data_ptr() for buffer in buffers]

    def kernel_address(self) -> int:
        """The product's C function, for C code that calls it (`decode_stack`)."""
        return native_library.address(self._kernel)

    @property
    def buffers(self) -> tuple[torch.Tensor, ...]:
        """The packed weights the kernel reads, in its argument order."""
        return self._buffers

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[..., in]` bfloat16 or float32 (anything else is taken as float32); the result in its dtype."""
        if x.dtype is torch.bfloat16 and x.dim() == 2 and x.is_contiguous():  # a step's rows: the fast path
            return self._product(x, True)
        bf16 = x.dtype == torch.bfloat16
        rows = x.reshape(-1, self.in_features)
        if not (bf16 or x.dtype == torch.float32) or not rows.is_contiguous():
            rows = rows.to(torch.bfloat16 if bf16 else torch.float32).contiguous()
        return self._product(rows, bf16).view(*x.shape[:-1], self.out_features).to(x.dtype)

    def _product(self, rows: torch.Tensor, bf16: bool) -> torch.Tensor:
        """The kernel over contiguous `[rows, in]` of its dtype (bfloat16 or float32)."""
        out = rows.new_empty(rows.shape[0], self.out_features)
        if not rows.shape[0]:  # a step with no row to compute (a prefill chunk that needs no logits)
            return out
        status = self._kernel(rows.data_ptr(), bf16, rows.shape[0], self.in_features, *self._pointers,
                              self.out_features, out.data_ptr(), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"{self._kernel.__name__} refused its inputs (status {status})")
        return out


class Int8BlockLinear(BlockLinear):
    """Q8_0: int8 `codes` `[out, in]` times a scale per block of 32 inputs `scales` `[out, in / 32]`."""

    @classmethod
    def load(cls, codes: torch.Tensor, scales: torch.Tensor) -> Int8BlockLinear | None:
        """The layer, or None (why, logged) where the kernel cannot run on this machine."""
        kernel = _kernel("int8_block_linear", 2)
        return None if kernel is None else cls(codes, scales, kernel)

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, kernel: Kernel) -> None:
        out_features, in_features = codes.shape
        tiles, blocks = -(-out_features // TILE), in_features // BLOCK_SIZE
        shifted = _tiled(codes.to(torch.int16) + 128, tiles, fill=128)  # VNNI takes the weights unsigned
        weights = (shifted.to(torch.uint8).view(tiles, TILE, blocks, GROUPS, 4).permute(0, 2, 3, 1, 4).contiguous())
        super().__init__(out_features, in_features, kernel, (weights, _tiled_scales(scales, tiles)))

    def dequantized(self) -> torch.Tensor:
        """The weights as the kernel sees them, `[out, in]` float32."""
        weights, scales = self._buffers
        tiles, blocks = weights.shape[0], weights.shape[1]
        codes = weights.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, blocks, BLOCK_SIZE).to(torch.int16) - 128
        block_scales = scales.transpose(1, 2).reshape(tiles * TILE, blocks, 1).float()
        return (codes.float() * block_scales).view(tiles * TILE, -1)[:self.out_features]


class Int4BlockLinear(BlockLinear):
    """Q4_1: 4-bit `codes` `[out, in]` (0..15), `weight = code * scale + offset` with a float16 scale and
    offset per block of 32 inputs (`[out, in / 32]` each; Q4_0's offset is -8 x its scale)."""

    @classmethod
    def load(cls, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> Int4BlockLinear | None:
        """The layer, or None where the kernel cannot run here or a scale or offset is not a float16 value."""
        kernel = _kernel("int4_block_linear", 3)
        if kernel is None or not all(torch.equal(t.float(), t.to(torch.float16).float()) for t in (scales, offsets)):
            return None
        return cls(codes, scales, offsets, kernel)

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, kernel: Kernel) -> None:
        out_features, in_features = codes.shape
        tiles, blocks = -(-out_features // TILE), in_features // BLOCK_SIZE
        grouped = _tiled(codes.to(torch.uint8), tiles).view(tiles, TILE, blocks, GROUPS, 4).permute(0, 2, 3, 1, 4)
        half = GROUPS // 2  # group g in the low nibbles, g + 4 in the high ones
        packed = (grouped[:, :, :half] | (grouped[:, :, half:] << 4)).contiguous()
        super().__init__(out_features, in_features, kernel,
                         (packed, _tiled_scales(scales, tiles), _tiled_scales(offsets, tiles)))

    def dequantized(self) -> torch.Tensor:
        """The weights as the kernel sees them, `[out, in]` float32."""
        packed, scales, offsets = self._buffers
        tiles, blocks = packed.shape[0], packed.shape[1]
        grouped = torch.cat([packed & 0x0F, packed >> 4], dim=2)  # [tiles, blocks, groups, 16, 4]
        codes = grouped.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, blocks, BLOCK_SIZE).float()
        per_block = [t.transpose(1, 2).reshape(tiles * TILE, blocks, 1).float() for t in (scales, offsets)]
        return (codes * per_block[0] + per_block[1]).view(tiles * TILE, -1)[:self.out_features]
