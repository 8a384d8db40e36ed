"""BlockCodes of every kind the block products take, and the products' exact arithmetic in float64."""

from __future__ import annotations

import pytest
import torch

from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_linear import BLOCK_SIZE, BlockLinear

# (bits, sub-block, widened from): GGUF's Q4_0/Q4_1/Q4_K, Q5_*, Q6_K, Q8_0, and Q4 widened as Q4_K_M's
# q/k fuse beside a Q6_K v
KINDS = [(4, 32, None), (5, 32, None), (6, 16, None), (8, 32, None), (6, 16, (4, 32))]
KIND_IDS = ["4-32", "5-32", "6-16", "8-32", "6-16-from-4-32"]

needs_kernel = pytest.mark.skipif(BlockLinear.load(BlockCodes.plain(torch.zeros(16, 32, dtype=torch.uint8), 4, 32,
                                                              torch.ones(16, 1), torch.zeros(16, 1))) is None,
                                  reason="no AVX512-VNNI or AVX2 CPU, or no C compiler here")


def block_codes(bits: int, sub_block: int, widened_from: tuple[int, int] | None, out_features: int,
                in_features: int, symmetric: bool, seed: int = 0) -> BlockCodes:
    """Random codes of the kind; offsets -center x scale where `symmetric` (Q4_0, Q6_K, Q8_0), else
    their own (Q4_1, K-quants' minimums)."""
    generator = torch.Generator().manual_seed(seed)
    made_bits, made_sub = widened_from or (bits, sub_block)
    codes = torch.randint(0, 1 << made_bits, (out_features, in_features), generator=generator, dtype=torch.uint8)
    scales = torch.rand(out_features, in_features // made_sub, generator=generator) / 16
    offsets = (-(1 << (made_bits - 1)) * scales if symmetric
               else torch.randn(out_features, in_features // made_sub, generator=generator) / 4)
    made = BlockCodes.plain(codes, made_bits, made_sub, scales, offsets)
    return made.widened(bits, sub_block) if widened_from else made


def rounded_rows(x: torch.Tensor, levels: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """x's rows as the kernels round them: per block of 32, int8 codes c1 in steps of the block's
    largest magnitude over 127; rows of float32 with two `levels` also c2 for what is left in steps
    254 times finer. Returns the codes (c1, or the combined 254 c1 + c2) `[rows, blocks, 32]` and
    the step of one unit of them per block `[rows, blocks]`."""
    blocks = x.float().view(x.shape[0], -1, BLOCK_SIZE)
    largest = blocks.abs().amax(dim=-1)
    # a true division, as the kernel's (torch's `127 / t` is 127 times a rounded reciprocal)
    inverse = torch.where(largest > 0, torch.full_like(largest, 127).div(largest), torch.zeros_like(largest))
    first = torch.round(blocks * inverse[..., None])
    if x.dtype is torch.bfloat16 or levels == 1:  # one level: 8-bit rows, as llama.cpp's
        return first, largest / 127
    left = (blocks.double() * inverse.double()[..., None] - first).float()  # from the exact product, as FMA
    second = torch.round(left * 254)
    return first * 254 + second, largest / 127 / 254


def exact_terms(x: torch.Tensor, codes: BlockCodes, center: int, levels: int = 2) -> torch.Tensor:
    """The product's sub-block terms in float64 `[rows, out, terms]`: per sub-block, the row block's
    step times (scale x the integer dot of the codes with the row's codes + offset x the sum of the
    row's codes); where the offsets are -center scales, step x scale x (dot - center x sum), the
    integer difference exact, as the kernel takes it."""
    x_codes, steps = rounded_rows(x, levels)
    rows, sub = x.shape[0], codes.sub_block
    x_sub = x_codes.double().view(rows, -1, sub)
    step = steps.double().repeat_interleave(BLOCK_SIZE // sub, dim=1)[:, None, :]
    dots = torch.einsum("rsk,osk->ros", x_sub, codes.codes.view(codes.out_features, -1, sub).double())
    sums = x_sub.sum(-1)[:, None, :]
    if center:
        return step * codes.scales.double()[None] * (dots - center * sums)
    return torch.cat([step * codes.scales.double()[None] * dots, step * codes.offsets.double()[None] * sums], -1)


def assert_sum_of(got: torch.Tensor, terms: torch.Tensor) -> None:
    """`got` `[rows, out]` is the sum of the float64 terms `[rows, out, terms]` to float32's rounding
    (a few roundings per term: int to float, the scales; one per addition), and to bfloat16's
    rounding of that sum where `got` is bfloat16."""
    exact = terms.sum(-1)
    bound = terms.abs().sum(-1) * (terms.shape[-1] + 4) * 2.0**-24
    if got.dtype is torch.bfloat16:
        bound = bound * (1 + 2.0**-8) + exact.abs() * 2.0**-8
    assert ((got.double() - exact).abs() <= bound + 1e-30).all()
