"""The layer steps in C against the same steps as torch ops."""

from __future__ import annotations

import pytest
import torch

from ztgi.services.worker.layers.layer_ops import NativeLayerOps, TorchLayerOps

NATIVE = NativeLayerOps.load()
needs_native = pytest.mark.skipif(NATIVE is None, reason="no AVX512-BF16 CPU or no C compiler here")
NATIVE_F32 = NativeLayerOps.load(torch.float32)
needs_native_f32 = pytest.mark.skipif(NATIVE_F32 is None, reason="no AVX2 CPU or no C compiler here")
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


def float32(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@needs_native_f32
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_float32_steps_equal_torchs_up_to_the_order_of_float32_sums(rows):
    """The float32 steps (AVX2): the residual sums and rotations bit for bit (or for the rotation
    within a fused multiply-add's rounding), the norms and the SiLU gate within a few float32 ulps
    of torch's (another order of the squares' sum, another exponential)."""
    x, residual, weight = float32(rows, 576, scale=3, seed=1), float32(rows, 576, seed=2), torch.rand(576) + 0.5
    for given in (residual, None):
        (normed, summed), (expected_normed, expected_summed) = (
            ops.add_rms_norm(x, given, weight, 1e-5) for ops in (NATIVE_F32, TORCH))
        assert torch.equal(summed, expected_summed)
        torch.testing.assert_close(normed, expected_normed, rtol=4e-6, atol=1e-6)
    gate_up = float32(rows, 2 * 1536, scale=3, seed=4)
    torch.testing.assert_close(NATIVE_F32.silu_mul(gate_up), TORCH.silu_mul(gate_up), rtol=4e-6, atol=1e-6)
    qkv = float32(rows, (9 + 3 + 3) * 64, seed=5)
    qk = qkv[:, :12 * 64].view(rows, 12, 64)  # a strided view, as the forward passes it
    cos, sin = (float32(rows, 64, seed=s).unsqueeze(1) for s in (6, 7))
    torch.testing.assert_close(NATIVE_F32.rotate(qk, cos, sin), TORCH.rotate(qk, cos, sin), rtol=2e-6, atol=1e-6)


@needs_native_f32
def test_the_float32_steps_leave_other_dtypes_and_shapes_to_torch():
    """bfloat16 rows, and widths the eight-lane loops do not cover, are torch's."""
    x, weight = bfloat16(4, 576), bfloat16(576, seed=1)
    assert torch.equal(NATIVE_F32.add_rms_norm(x, x, weight, 1e-5)[0], TORCH.add_rms_norm(x, x, weight, 1e-5)[0])
    gate_up = float32(4, 2 * 12)
    assert torch.equal(NATIVE_F32.silu_mul(gate_up), TORCH.silu_mul(gate_up))
    odd = float32(3, 2, 24)
    cos, sin = float32(3, 24, seed=1).unsqueeze(1), float32(3, 24, seed=2).unsqueeze(1)
    assert torch.equal(NATIVE_F32.rotate(odd, cos, sin), TORCH.rotate(odd, cos, sin))
