"""`FactoredScales`: a sub-block's scale (or offset) as a float factor per super-block times a small integer.

GGUF's K-quants store a weight's scale as `d * sc`: `d` a float16 per super-block of 256 inputs,
`sc` a 6-bit (Q4_K, Q5_K) or int8 (Q6_K) integer per sub-block of 32 or 16; their minimums the
same (`dmin * m`). Kept in that form the scales cost a tenth of the bits float32 per sub-block
would, and every product `factor * integer` is exact in float32 (a float16 has 11 significant
bits, an int8 at most 8), so the kernel forms each scale as the same float the file means. The
legacy types (Q4_0, ..., Q8_0) have one float16 per block and no integer: `integers` None, the
factors' block the sub-block itself (`plain`), which any float32 scales also take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

INT8_RANGE = (-128, 127)


@dataclasses.dataclass(frozen=True)
class FactoredScales:
    """`values()[o, j] = factors[o, j * sub_block // super_block] * integers[o, j]` in float32.

    `factors` float32 `[out, in / super_block]`; `integers` int8 `[out, in / sub_block]`, or None for
    ones (then `super_block == sub_block`)."""

    factors: torch.Tensor
    integers: torch.Tensor | None
    super_block: int
    sub_block: int

    def __post_init__(self) -> None:
        if self.super_block % self.sub_block or (self.integers is None and self.super_block != self.sub_block):
            raise ValueError(f"FactoredScales: super-blocks of {self.super_block} over sub-blocks of "
                             f"{self.sub_block} ({'no ' if self.integers is None else ''}integers)")
        if self.integers is not None and (self.integers.dtype != torch.int8 or self.integers.shape[0] !=
                                          self.factors.shape[0] or self.integers.shape[1] != self.per_factor *
                                          self.factors.shape[1]):
            raise ValueError(f"FactoredScales: int8 integers {list(self.integers.shape)} "
                             f"{self.integers.dtype} for factors {list(self.factors.shape)}, "
                             f"{self.per_factor} per factor")

    @classmethod
    def plain(cls, values: torch.Tensor, sub_block: int) -> FactoredScales:
        """Any scales `[out, in / sub_block]`: each its own factor."""
        return cls(values.float().contiguous(), None, sub_block, sub_block)

    @classmethod
    def of_integers(cls, factors: torch.Tensor, integers: torch.Tensor, super_block: int,
                    sub_block: int) -> FactoredScales:
        """ValueError unless `integers` (any integer dtype) lie in int8's range."""
        low, high = INT8_RANGE
        if integers.numel() and (int(integers.min()) < low or int(integers.max()) > high):
            raise ValueError(f"FactoredScales: integers must lie in {low}..{high}")
        return cls(factors.float().contiguous(), integers.to(torch.int8).contiguous(), super_block, sub_block)

    @property
    def per_factor(self) -> int:
        return self.super_block // self.sub_block

    def values(self) -> torch.Tensor:
        """The scales, float32 `[out, in / sub_block]` (each product exact where the factors are float16)."""
        if self.integers is None:
            return self.factors
        return self.factors.repeat_interleave(self.per_factor, dim=1) * self.integers.float()

    def rows(self, order: torch.Tensor) -> FactoredScales:
        return FactoredScales(self.factors[order], None if self.integers is None else self.integers[order],
                              self.super_block, self.sub_block)

    def columns(self, start: int, stop: int) -> FactoredScales:
        """The scales of inputs `start .. stop` (on super-block boundaries)."""
        factors = self.factors[:, start // self.super_block:stop // self.super_block].contiguous()
        integers = (None if self.integers is None else
                    self.integers[:, start // self.sub_block:stop // self.sub_block].contiguous())
        return FactoredScales(factors, integers, self.super_block, self.sub_block)

    def widened(self, sub_block: int) -> FactoredScales:
        """The same scales over sub-blocks of `sub_block` (dividing this one's): each repeated."""
        repeat = self.sub_block // sub_block
        if self.integers is None:
            return FactoredScales.plain(self.factors.repeat_interleave(repeat, dim=1), sub_block)
        return FactoredScales(self.factors, self.integers.repeat_interleave(repeat, dim=1), self.super_block,
                              sub_block)

    def float16_exact(self) -> bool:
        """Whether every factor is a float16 (then the kernel reads them as float16)."""
        back = self.factors.to(torch.float16).float()
        return torch.equal(back.view(torch.int32), self.factors.view(torch.int32))

    @staticmethod
    def concat(parts: Sequence[FactoredScales]) -> FactoredScales:
        """Stacked by rows (one sub-block size among them): factored where every part is, by one
        super-block, else plain."""
        first = parts[0]
        if all(p.integers is not None and p.super_block == first.super_block for p in parts):
            return FactoredScales(torch.cat([p.factors for p in parts]),
                                  torch.cat([p.integers for p in parts if p.integers is not None]),
                                  first.super_block, first.sub_block)
        return FactoredScales.plain(torch.cat([p.values() for p in parts]), first.sub_block)
