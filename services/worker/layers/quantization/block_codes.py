"""`BlockCodes`: a weight matrix as unsigned integer codes with a float scale and offset per sub-block.

Every GGUF block type ztgi multiplies as stored comes down to this one form:
`weight[o, i] = scales[o, i // sub_block] * codes[o, i] + offsets[o, i // sub_block]`, with codes of
4, 5, 6 or 8 bits and sub-blocks of 16 or 32 inputs. Q4_0 is 4-bit codes with the offset -8 scales;
Q4_1 its own offset; Q5_0/Q5_1 the same with 5 bits; Q8_0 is 8-bit codes (the file's signed ones
plus 128) with the offset -128 scales; Q4_K/Q5_K a sub-block scale and minimum each times the super-
block's two float16 factors (exact in float32); Q6_K 6-bit codes, sub-blocks of 16, offset -32
scales. The scales and offsets keep the file's factored form (`FactoredScales`): the kernel reads a
tenth of the bytes float32 per sub-block would take. One form means one C kernel, and layers whose
parts the file stores in different types (Q4_K_M's q and k beside a Q6_K v) can fuse without loss:
`widened` gives codes more bits and repeats each scale over finer sub-blocks, which changes no
weight (torch's fallback takes that; the C product keeps such parts apart in one call instead,
`BlockLinear.load_stacked`, which reads fewer bytes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ztgi.services.worker.layers.quantization.factored_scales import FactoredScales

BITS = (4, 5, 6, 8)
SUB_BLOCKS = (16, 32)


@dataclasses.dataclass(frozen=True)
class BlockCodes:
    """`codes` uint8 `[out, in]` below `2 ** bits`; scales and offsets per sub-block in factored form
    (`scales`, `offsets`: their float32 values `[out, in // sub_block]`). `plain` takes float scales."""

    codes: torch.Tensor
    bits: int
    sub_block: int
    factored_scales: FactoredScales
    factored_offsets: FactoredScales

    def __post_init__(self) -> None:
        out_features, in_features = self.codes.shape
        if self.bits not in BITS or self.sub_block not in SUB_BLOCKS or in_features % self.sub_block:
            raise ValueError(f"BlockCodes: {self.bits} bits and sub-blocks of {self.sub_block} over {in_features} "
                             f"inputs (bits {BITS}, sub-blocks {SUB_BLOCKS} dividing the inputs)")
        expected = (out_features, in_features // self.sub_block)
        for form in (self.factored_scales, self.factored_offsets):
            shape = (form.factors.shape[0], form.factors.shape[1] * form.super_block // self.sub_block)
            if form.sub_block != self.sub_block or shape != expected or in_features % form.super_block:
                raise ValueError(f"BlockCodes: scales and offsets must be {list(expected)} by sub-blocks of "
                                 f"{self.sub_block}, not {list(shape)} by {form.sub_block} (super-blocks of "
                                 f"{form.super_block} dividing the {in_features} inputs)")

    @classmethod
    def plain(cls, codes: torch.Tensor, bits: int, sub_block: int, scales: torch.Tensor,
              offsets: torch.Tensor) -> BlockCodes:
        """From float `scales` and `offsets` `[out, in // sub_block]`."""
        return cls(codes, bits, sub_block, FactoredScales.plain(scales, sub_block),
                   FactoredScales.plain(offsets, sub_block))

    @property
    def scales(self) -> torch.Tensor:
        return self.factored_scales.values()

    @property
    def offsets(self) -> torch.Tensor:
        return self.factored_offsets.values()

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    def dequantized(self) -> torch.Tensor:
        """The weights, float32 `[out, in]`."""
        groups = self.codes.view(self.out_features, -1, self.sub_block).float()
        weights = groups * self.scales[..., None] + self.offsets[..., None]
        return weights.view(self.out_features, self.in_features)

    def permuted_rows(self, order: torch.Tensor) -> BlockCodes:
        return BlockCodes(self.codes[order], self.bits, self.sub_block, self.factored_scales.rows(order),
                          self.factored_offsets.rows(order))

    def columns(self, start: int, stop: int) -> BlockCodes | None:
        """The weights of inputs `start .. stop`, or None where those are not whole super-blocks."""
        block = max(self.factored_scales.super_block, self.factored_offsets.super_block)
        if start % block or stop % block:
            return None
        return BlockCodes(self.codes[:, start:stop].contiguous(), self.bits, self.sub_block,
                          self.factored_scales.columns(start, stop), self.factored_offsets.columns(start, stop))

    def widened(self, bits: int, sub_block: int) -> BlockCodes:
        """The same weights with codes of `bits` (at least these) and sub-blocks of `sub_block`
        (at most these, dividing them): lossless."""
        if bits < self.bits or self.sub_block % sub_block:
            raise ValueError(f"cannot widen {self.bits}-bit codes by {self.sub_block} to {bits} bits by {sub_block}")
        return BlockCodes(self.codes, bits, sub_block, self.factored_scales.widened(sub_block),
                          self.factored_offsets.widened(sub_block))

    @staticmethod
    def concat(parts: Sequence[BlockCodes]) -> BlockCodes:
        """Parts stacked by rows (fused q/k/v, gate/up), each widened to the most bits and the
        finest sub-block among them."""
        bits, sub_block = max(p.bits for p in parts), min(p.sub_block for p in parts)
        widened = [p.widened(bits, sub_block) for p in parts]
        return BlockCodes(torch.cat([p.codes for p in widened]), bits, sub_block,
                          FactoredScales.concat([p.factored_scales for p in widened]),
                          FactoredScales.concat([p.factored_offsets for p in widened]))
