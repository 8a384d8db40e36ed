"""The output matrix (lm_head) as int8 codes with a scale per block of 32 inputs: GGUF's Q8_0, in C.

A decode step of one row reads every weight once for a few operations each, so the lm_head's
bytes are its time: at bfloat16 SmolLM2's 49152 x 576 head is the largest single read of the
step. The GGUF file ships it as Q8_0 (its token embedding, tied), which is what llama.cpp computes
with; `--quantize int4|int8` now does too: `csrc/int8_block_linear.c` rounds each activation row to
int8 per block, as llama.cpp does, and sums the blocks' products exactly in int32 with AVX512-VNNI.
Without the file's blocks the float head is rounded to Q8_0 here (`quantize_blocks`). The layer
needs a CPU with AVX512-VNNI and a C compiler (`native_library`); elsewhere `load` returns None
and the head stays a float matrix.
"""

from __future__ import annotations

import functools

import torch

from services.worker.paged import native_library
from services.worker.paged.native_library import INT, INT64, POINTER

BLOCK_SIZE = 32
TILE = 16  # outputs side by side in one VNNI operand
INT8_MAX = 127
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")


@functools.cache
def _kernel():
    library = native_library.load_or_none("int8_block_linear.c", "the int8 lm_head", CPU_FLAGS)
    if library is None:
        return None
    return native_library.bind(library, "int8_block_linear", [POINTER, INT64, INT64, POINTER, POINTER, INT64,
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


class Int8BlockLinear:
    """`y = x @ W.T` with W as int8 `codes` `[out, in]` times a scale per block of 32 inputs `scales`
    `[out, in / 32]`; the activations rounded to int8 per block in the kernel. Build with `load`."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, kernel) -> None:
        self.out_features, self.in_features = codes.shape
        if self.in_features % BLOCK_SIZE:
            raise ValueError(f"Q8_0 needs a multiple of {BLOCK_SIZE} inputs, not {self.in_features}")
        tiles, blocks = -(-self.out_features // TILE), self.in_features // BLOCK_SIZE
        shifted = torch.full((tiles * TILE, self.in_features), 128, dtype=torch.int16)
        shifted[:self.out_features] += codes.to(torch.int16)  # VNNI takes the weights as unsigned bytes
        self.weights = (shifted.to(torch.uint8).view(tiles, TILE, blocks, BLOCK_SIZE // 4, 4)
                        .permute(0, 2, 3, 1, 4).contiguous())
        padded_scales = torch.zeros(tiles * TILE, blocks)
        padded_scales[:self.out_features] = scales.float()
        self.scales = padded_scales.view(tiles, TILE, blocks).transpose(1, 2).to(torch.float16).contiguous()
        self._kernel = kernel

    @classmethod
    def load(cls, codes: torch.Tensor, scales: torch.Tensor) -> Int8BlockLinear | None:
        """The layer, or None (why, logged) where the kernel cannot run on this machine."""
        kernel = _kernel()
        return cls(codes, scales, kernel) if kernel is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        status = self._kernel(rows.data_ptr(), rows.shape[0], self.in_features, self.weights.data_ptr(),
                              self.scales.data_ptr(), self.out_features, out.data_ptr(), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"int8_block_linear refused its inputs (status {status})")
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weights as the kernel sees them, `[out, in]` float32."""
        tiles, blocks = self.weights.shape[0], self.weights.shape[1]
        codes = self.weights.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, -1).to(torch.int16) - 128
        scales = self.scales.transpose(1, 2).reshape(tiles * TILE, blocks).float()
        weight = codes.view(tiles * TILE, blocks, BLOCK_SIZE).float() * scales[..., None]
        return weight.view(tiles * TILE, -1)[:self.out_features]
