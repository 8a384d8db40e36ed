"""The layer steps in C against the same steps as torch ops."""

from __future__ import annotations

import pytest
import torch

from ztgi.services.worker.layers.layer_ops import NativeLayerOps, TorchLayerOps

NATIVE = NativeLayerOps.load()
needs_native = pytest.mark.skipif(NATIVE is None, reason="no AVX512-BF16 CPU or no C compiler here")
TORCH = TorchLayerOps()


def bfloat16(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


@needs_native
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_steps_round_where_torch_rounds(rows):
    """Residual add with RMSNorm, the SiLU gate and rotary give torch's bfloat16 results: the sums and
    rotations bit for bit, the norms in all but a rare last bit (the float32 sum's order), the gate
    bit for bit (torch's is the exactly rounded one)."""
    x, residual = bfloat16(rows, 576, scale=3, seed=1), bfloat16(rows, 576, seed=2)
    weight = (torch.rand(576, generator=torch.Generator().manual_seed(3)) + 0.5).to(torch.bfloat16)
    for given in (residual, None):
        (normed, summed), (expected_normed, expected_summed) = (
            ops.add_rms_norm(x, given, weight, 1e-5) for ops in (NATIVE, TORCH))
        assert torch.equal(summed, expected_summed)
        assert (normed != expected_normed).double().mean() < 1e-3
    gate_up = bfloat16(rows, 2 * 1536, scale=3, seed=4)
    assert torch.equal(NATIVE.silu_mul(gate_up), TORCH.silu_mul(gate_up))
    qkv = bfloat16(rows, (9 + 3 + 3) * 64, seed=5)
    qk = qkv[:, :12 * 64].view(rows, 12, 64)  # a strided view, as the forward passes it
    cos, sin = (bfloat16(rows, 64, seed=s).unsqueeze(1) for s in (6, 7))
    assert torch.equal(NATIVE.rotate(qk, cos, sin), TORCH.rotate(qk, cos, sin))


@needs_native
def test_inputs_the_c_steps_do_not_take_go_to_torch():
    """float32 activations, and a head size the rotary loop does not cover, are torch's."""
    x, weight = torch.randn(4, 576), torch.rand(576) + 0.5
    normed, _ = NATIVE.add_rms_norm(x, x, weight, 1e-5)
    assert torch.equal(normed, TORCH.add_rms_norm(x, x, weight, 1e-5)[0])
    gate_up = torch.randn(4, 64)
    assert torch.equal(NATIVE.silu_mul(gate_up), TORCH.silu_mul(gate_up))
    odd = bfloat16(3, 2, 48)
    cos, sin = bfloat16(3, 48, seed=1).unsqueeze(1), bfloat16(3, 48, seed=2).unsqueeze(1)
    assert torch.equal(NATIVE.rotate(odd, cos, sin), TORCH.rotate(odd, cos, sin))
