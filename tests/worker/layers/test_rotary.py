"""`Rotary.cos_sin`: the rows of its table of positions equal what transformers' module returns for
the same positions, bit for bit, for every rope type whose frequencies are fixed; the rope types
that rescale with the sequence length are computed by the module at every step."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ztgi.services.worker.layers.rotary import Rotary

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


def _module(scaling: dict | None) -> LlamaRotaryEmbedding:
    config = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=4096,
                         rope_scaling=scaling)
    return LlamaRotaryEmbedding(config=config)


def _expected(module: LlamaRotaryEmbedding, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    cos, sin = module(x[None], positions[None])
    return cos[0].unsqueeze(1), sin[0].unsqueeze(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", SCALINGS)
def test_table_rows_equal_the_modules_own(name, dtype):
    module = _module(SCALINGS[name])
    rotary = Rotary(module)
    assert rotary.static == (name != "dynamic")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=generator).to(dtype)
    # a decode step's scattered positions, then positions past the first table (it grows), then a prefill run
    steps = [torch.tensor([0, 17, 3, 200, 255]), torch.tensor([256, 1000, 7, 4000, 2047]), torch.arange(300, 305)]
    for positions in steps:
        cos, sin = rotary.cos_sin(x, positions)
        expected_cos, expected_sin = _expected(module, x, positions)
        assert cos.dtype == dtype and cos.shape == expected_cos.shape == (5, 1, 64)
        assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)


def test_dynamic_rope_past_its_original_length_is_the_modules_at_that_length():
    """Dynamic NTK rescales its frequencies once a sequence passes the original length: no table."""
    module = _module(SCALINGS["dynamic"])
    rotary = Rotary(module)
    x = torch.randn(3, 256)
    positions = torch.tensor([10, 5000, 6000])
    cos, sin = rotary.cos_sin(x, positions)
    expected_cos, expected_sin = _expected(_module(SCALINGS["dynamic"]), x, positions)
    assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)
    assert not rotary._tables
