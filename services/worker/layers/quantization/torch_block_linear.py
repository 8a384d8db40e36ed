"""`torch_block_linear`: a `BlockCodes` layer from torch's own kernels, for CPUs without ours.

Where the C block products cannot run (neither AVX512-VNNI/BF16 nor AVX2, no compiler, `--no-native-kernels`),
4-bit codes by groups of 32 (Q4_0, Q4_1, Q4_K) keep their bytes' worth in torch's int4 kernel,
which takes exactly that form (a scale and a zero per group of 32, in the activations' dtype)
where the outputs are a multiple of 16 (its packing's); any other kind or shape is de-quantized
once to a packed float matrix (oneDNN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.quantized_linear import GROUP_SIZE, GroupCodes, Int4Linear

INT4_OUTPUTS_MULTIPLE = 16  # torch's int4 packing takes whole tiles of 16 outputs


def torch_block_linear(codes: BlockCodes, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """`x @ W.T` for `x` of `dtype`: torch's int4 layer for 4-bit codes by 32 (outputs a multiple of
    16), else `PackedLinear`."""
    if codes.bits == 4 and codes.sub_block == GROUP_SIZE and codes.out_features % INT4_OUTPUTS_MULTIPLE == 0:
        return Int4Linear(GroupCodes(codes.codes, codes.scales.float(), codes.offsets.float()), dtype)
    return PackedLinear(codes.dequantized().to(dtype))
