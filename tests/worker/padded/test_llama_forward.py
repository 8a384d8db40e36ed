"""ztgi's own Llama forward and its packed linear layers equal the `transformers` module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, LlamaConfig

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.services.worker.layers.packed_linear import DenseRows, PackedLinear
from ztgi.services.worker.padded.model import PaddedModel as Model
from ztgi.services.worker.padded.model import resolve_backend


def test_auto_backend_is_native_for_llama_and_transformers_otherwise():
    """auto picks the native forward for plain Llama, transformers for anything else."""
    assert resolve_backend("auto", LlamaConfig()) == "native"
    assert resolve_backend("auto", LlamaConfig(attention_bias=True)) == "transformers"
    assert resolve_backend("auto", GPT2Config()) == "transformers"
    assert resolve_backend("transformers", LlamaConfig()) == "transformers"


def test_native_backend_for_another_architecture_is_a_clear_error():
    """Asking for the native forward of a model it does not have names the way out."""
    with pytest.raises(ValueError, match="--backend transformers"):
        resolve_backend("native", GPT2Config())
    with pytest.raises(ValueError, match="must be one of"):
        resolve_backend("fast", LlamaConfig())


def test_tiny_model_uses_the_native_forward(tiny_model: Model, tiny_transformers_model: Model):
    """The fixtures cover both forwards."""
    assert (tiny_model.backend, tiny_transformers_model.backend) == ("native", "transformers")


def test_prefill_logits_of_every_position_equal_transformers(tiny_model: Model, tiny_reference: torch.nn.Module):
    """Left-padded prefill: every real position's logits equal the module's on that prompt alone."""
    prompts = [[1, 504, 3458, 282, 4649, 30], [9690, 30], [5, 6, 7, 8]]
    batch = batch_of(tiny_model, [request(i, ids, 2) for i, ids in enumerate(prompts)])
    with torch.inference_mode():
        logits, _ = tiny_model.forward(batch, all_positions=True)
        for row, ids in enumerate(prompts):
            expected = tiny_reference(torch.tensor([ids])).logits[0]
            torch.testing.assert_close(logits[row, -len(ids):], expected, rtol=1e-4, atol=1e-4)
            assert torch.isfinite(logits[row]).all()  # padding positions too: no empty softmax row


def test_both_backends_generate_the_same_tokens(tiny_model: Model, tiny_transformers_model: Model):
    """A mixed batch (lengths, greedy and seeded sampling) gives identical tokens through either forward."""
    requests = [request(1, [1, 504, 3458, 282], 12, ignore_eos=True),
                request(2, [9690], 7, ignore_eos=True, do_sample=True, seed=3, temperature=0.7),
                request(3, [5, 6, 7, 8, 9, 10, 11], 9, ignore_eos=True, top_k=5, do_sample=True, seed=9)]
    native = token_ids(run_to_end(tiny_model, batch_of(tiny_model, requests)))
    generic = token_ids(run_to_end(tiny_transformers_model, batch_of(tiny_transformers_model, requests)))
    assert native == generic


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_f_linear(dtype: torch.dtype):
    """The layer gives F.linear's result (summation order aside) for 1, 16 and 3-d inputs. float32
    keeps its weight plain for the C rows product where the CPU has AVX2, else packs it; bfloat16
    packs only where oneDNN has a bf16 kernel (AVX-512 or AVX-NE-CONVERT; an AVX2-only CPU keeps the
    plain weight, with the same results)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    layer = PackedLinear(weight)
    if dtype == torch.float32:
        assert layer.packed == (DenseRows.load() is None)
    else:
        assert layer.packed == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for shape in ((1, 64), (16, 64), (2, 5, 64)):
        x = torch.randn(shape, generator=generator).to(dtype)
        torch.testing.assert_close(layer(x).float(), F.linear(x, weight).float(), rtol=tolerance, atol=tolerance)


def test_float16_weights_stay_plain():
    """oneDNN does not take float16 here: the layer keeps the plain weight and F.linear."""
    weight = torch.randn(8, 4).half()
    layer = PackedLinear(weight)
    assert not layer.packed and layer(torch.ones(2, 4).half()).shape == (2, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_rounds_as_transformers(dtype: torch.dtype):
    """The forward's RMSNorm equals transformers' `LlamaRMSNorm` bit for bit in float32 and bfloat16
    (normalized in float32, cast, then scaled): bfloat16 greedy parity rests on it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from ztgi.services.worker.layers.norm import rms_norm

    generator = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(64, eps=1e-5)
    norm.weight.data = 1 + 0.1 * torch.randn(64, generator=generator)
    norm = norm.to(dtype)
    x = (3 * torch.randn(2, 7, 64, generator=generator)).to(dtype)
    with torch.inference_mode():
        assert torch.equal(rms_norm(x, norm.weight, 1e-5), norm(x))
