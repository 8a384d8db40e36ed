"""`torch_block_linear`: the product of any `BlockCodes` with torch's kernels, where ours cannot run."""

from __future__ import annotations

import pytest
import torch

from tests.worker.layers.block_helpers import KIND_IDS, KINDS, block_codes
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.quantized_linear import Int4Linear
from ztgi.services.worker.layers.quantization.torch_block_linear import torch_block_linear


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("out_features", [48, 40])
def test_torch_path_multiplies_the_codes_weights(kind, dtype, out_features):
    """4-bit codes by 32 through torch's int4 kernel (its scales and zeros in the activations'
    dtype) where it takes the shape (outputs a multiple of 16), the rest as a float matrix: x @ W.T
    to the dtype's rounding."""
    codes = block_codes(*kind, out_features, 96, kind[0] == 8, seed=4)
    layer = torch_block_linear(codes, dtype)
    assert isinstance(layer, Int4Linear if kind[:2] == (4, 32) and out_features == 48 else PackedLinear)
    weights = codes.dequantized().double()
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(5)).to(dtype)
    y = layer(x)
    assert y.shape == (2, 5, out_features) and y.dtype == dtype
    # bfloat16: x, the int4 kernel's scales and zeros, and the result each rounded to 8 bits
    tolerance = 2.0**-6 if dtype is torch.bfloat16 else 2.0**-18
    scale = x.double().abs() @ weights.abs().T
    assert ((y.double() - x.double() @ weights.T).abs() <= tolerance * scale + 1e-9).all()
