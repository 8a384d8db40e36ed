"""`BlockLayout`: a `BlockCodes` matrix packed as `kernels/csrc/block_weights.h` lays it out, and back.

Outputs in tiles of 16, inputs in blocks of 32; per tile and block, eight VNNI groups of four
inputs, each the tile's 16 outputs' four codes side by side (64 bytes, one operand). 8-bit codes
stay bytes; fewer bits keep their low four as nibbles (group g low, g + 4 high) and each higher bit
as a plane, one 64-bit mask per group, which the kernel adds back with a masked byte add. Scales and
offsets keep their factored form (`FactoredScales`): per tile, vectors of 16 factors per super-block
(float16 where every factor is one, else float32) and of 16 int8 integers per sub-block (none where
the factors are the scales themselves); the kernel multiplies them back. Where every offset is
-center times its scale (Q4_0, Q5_0, Q6_K, Q8_0: half the codes' range; the same widened) the
offsets are not stored: the kernel takes center times the activations' code sum off its exact
integer dot instead, so those formats keep integer exactness where a float offset term would cancel
against the dot.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.factored_scales import FactoredScales

BLOCK_SIZE = 32
TILE = 16  # outputs side by side in one VNNI operand
GROUPS = BLOCK_SIZE // 4  # four inputs per VNNI lane
NIBBLE_BITS = 4


def _tiled(values: torch.Tensor, tiles: int) -> torch.Tensor:
    """`[out, ...]` padded with zeros to whole tiles of 16 outputs: `[tiles, 16, ...]`."""
    padded = values.new_zeros((tiles * TILE, *values.shape[1:]))
    padded[:values.shape[0]] = values
    return padded.view(tiles, TILE, *values.shape[1:])


def _center(codes: BlockCodes) -> int:
    """The integer every offset is minus that times its scale (half the codes' range as stored, or
    as stored before widening), else 0."""
    scales, offsets = codes.scales, codes.offsets
    nonzero = scales.nonzero()
    if not len(nonzero):
        return 0
    first = tuple(nonzero[0].tolist())
    center = round(-float(offsets[first]) / float(scales[first]))
    return center if 0 < center < (1 << codes.bits) and torch.equal(offsets, -center * scales) else 0


def _kernel_forms(codes: BlockCodes, center: int) -> tuple[FactoredScales, FactoredScales | None]:
    """The scales' and (unless `center`) the offsets' forms as the kernel takes them: factored where
    the scales have integers by super-blocks of whole blocks and the offsets (if any) the same
    super-blocks, else both plain."""
    scales, offsets = codes.factored_scales, None if center else codes.factored_offsets
    if scales.integers is not None and scales.super_block >= BLOCK_SIZE and (
            offsets is None or offsets.super_block == scales.super_block):
        return scales, offsets
    return (FactoredScales.plain(scales.values(), codes.sub_block),
            None if offsets is None else FactoredScales.plain(offsets.values(), codes.sub_block))


def _tiled_by_inputs(values: torch.Tensor, tiles: int) -> torch.Tensor:
    """`[out, k]` as the kernel reads it: `[tiles, k, 16]`."""
    return _tiled(values, tiles).transpose(1, 2).contiguous()


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """The packed buffers (`codes`, `planes`, the factors and integers; `planes`, `offset_factors`
    and the integers may be empty) and what the kernel needs to read them."""

    bits: int
    sub_block: int
    super_block: int       # inputs per factor
    center: int
    out_features: int
    in_features: int
    codes: torch.Tensor    # uint8 [tiles, blocks, 8 or 4, 16, 4]
    planes: torch.Tensor   # uint8 [tiles, blocks, bits - 4, 8, 8]: little-endian 64-bit masks
    scale_factors: torch.Tensor   # float16 (where all are) or float32 [tiles, in / super_block, 16]
    scale_integers: torch.Tensor  # int8 [tiles, in / sub_block, 16], or empty for ones
    offset_factors: torch.Tensor  # like scale_factors, or empty where `center`
    offset_integers: torch.Tensor  # like scale_integers

    @classmethod
    def pack(cls, codes: BlockCodes) -> BlockLayout:
        """ValueError where the inputs are not whole blocks of 32."""
        out_features, in_features = codes.out_features, codes.in_features
        if in_features % BLOCK_SIZE:
            raise ValueError(f"block products need a multiple of {BLOCK_SIZE} inputs, not {in_features}")
        tiles, blocks = -(-out_features // TILE), in_features // BLOCK_SIZE
        grouped = (_tiled(codes.codes.to(torch.uint8), tiles).view(tiles, TILE, blocks, GROUPS, 4)
                   .permute(0, 2, 3, 1, 4))  # [tiles, blocks, groups, 16, 4]
        center = _center(codes)
        if codes.bits == 8:
            packed, planes = grouped.contiguous(), torch.empty(0, dtype=torch.uint8)
        else:
            low = grouped & 0x0F
            packed = (low[:, :, :GROUPS // 2] | (low[:, :, GROUPS // 2:] << 4)).contiguous()
            planes = _planes(grouped, codes.bits)
        scales, offsets = _kernel_forms(codes, center)
        forms = [scales] if offsets is None else [scales, offsets]
        half = all(form.float16_exact() for form in forms)
        factors = [_tiled_by_inputs(f.factors.to(torch.float16 if half else torch.float32), tiles) for f in forms]
        integers = [torch.empty(0, dtype=torch.int8) if f.integers is None else _tiled_by_inputs(f.integers, tiles)
                    for f in forms]
        if offsets is None:
            factors.append(torch.empty(0, dtype=factors[0].dtype))
            integers.append(torch.empty(0, dtype=torch.int8))
        return cls(codes.bits, codes.sub_block, scales.super_block, center, out_features, in_features, packed,
                   planes, factors[0], integers[0], factors[1], integers[1])

    @property
    def nbytes(self) -> int:
        """What the kernel reads per product."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.planes, self.scale_factors,
                                                          self.scale_integers, self.offset_factors,
                                                          self.offset_integers))

    def unpacked(self) -> BlockCodes:
        """The codes, scales and offsets read back from the buffers (what the kernel multiplies by)."""
        grouped = self.codes if self.bits == 8 else torch.cat([self.codes & 0x0F, self.codes >> 4], dim=2)
        grouped = grouped.clone()
        for plane in range(self.bits - NIBBLE_BITS if self.bits != 8 else 0):
            bits = (self.planes[:, :, plane, :, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1
            grouped |= bits.reshape(grouped.shape) << (NIBBLE_BITS + plane)
        tiles, blocks = grouped.shape[0], grouped.shape[1]
        codes = grouped.permute(0, 3, 1, 2, 4).reshape(tiles * TILE, blocks * BLOCK_SIZE)
        rows = slice(0, self.out_features)
        scales = self._form(self.scale_factors, self.scale_integers)
        offsets = (FactoredScales.plain(-self.center * scales.values(), self.sub_block) if self.center
                   else self._form(self.offset_factors, self.offset_integers))
        every = torch.arange(self.out_features)
        return BlockCodes(codes[rows].contiguous(), self.bits, self.sub_block, scales.rows(every),
                          offsets.rows(every))

    def _form(self, factors: torch.Tensor, integers: torch.Tensor) -> FactoredScales:
        """A factored form `[tiles * 16, ...]` read back from its buffers."""
        def untiled(values: torch.Tensor) -> torch.Tensor:
            return values.transpose(1, 2).reshape(values.shape[0] * TILE, -1).contiguous()
        if not integers.numel():
            return FactoredScales.plain(untiled(factors.float()), self.sub_block)
        return FactoredScales(untiled(factors.float()), untiled(integers), self.super_block, self.sub_block)


def _planes(grouped: torch.Tensor, bits: int) -> torch.Tensor:
    """Bits 4 and up of the codes `[tiles, blocks, groups, 16, 4]`: per plane and group the 64 bytes'
    bits as a little-endian 64-bit mask, `[tiles, blocks, planes, groups, 8]` bytes."""
    tiles, blocks = grouped.shape[0], grouped.shape[1]
    codes = grouped.contiguous().numpy().reshape(tiles, blocks, 1, GROUPS, 64)
    shifts = np.arange(NIBBLE_BITS, bits, dtype=np.uint8).reshape(1, 1, -1, 1, 1)
    planes = np.packbits((codes >> shifts) & 1, axis=-1, bitorder="little")
    return torch.from_numpy(planes) if bits > NIBBLE_BITS else torch.empty(0, dtype=torch.uint8)
