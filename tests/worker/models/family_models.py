"""Tiny random-weight models of each natively served family, with SmolLM2's real tokenizer.

Small windows (8) and soft-caps that bite, so prompts of 20 to 40 tokens exercise them, and the rope
scalings these families ship with (linear, yarn, Phi-3's longrope with partial rotary, Gemma 3's
local and global bases).
"""

from __future__ import annotations

import os
import shutil

import torch

from tests.conftest import TOKENIZER_FILES

WINDOW = 8
COMMON = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=2)
ALTERNATING = ["sliding_attention", "full_attention"]


def family_config(model_type: str):
    """A 2-layer config of `model_type` with its distinctive options switched on."""
    from transformers import Gemma2Config, Gemma3TextConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    match model_type:
        case "mistral":
            return MistralConfig(**COMMON, sliding_window=WINDOW, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
        case "qwen2":
            return Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0,
                               layer_types=ALTERNATING, tie_word_embeddings=True)
        case "qwen3":
            return Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True, rope_parameters={
                "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 512})
        case "phi3":
            return Phi3Config(**COMMON, sliding_window=WINDOW, partial_rotary_factor=0.5, tie_word_embeddings=False,
                              original_max_position_embeddings=1024, rope_parameters={
                                  "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.5, 2.0, 3.0],
                                  "long_factor": [2.0, 3.0, 4.0, 5.0], "original_max_position_embeddings": 1024})
        case "gemma2":
            return Gemma2Config(**COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                layer_types=ALTERNATING, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
        case "gemma3_text":
            return Gemma3TextConfig(**COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                    layer_types=ALTERNATING, final_logit_softcapping=3.0, rope_parameters={
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                        "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                           "rope_theta": 1000000.0}})
    raise ValueError(model_type)


def save_family_model(model_type: str, directory: str, tokenizer_dir: str) -> str:
    """Random weights (seeded) of `model_type` saved as safetensors with the tokenizer files."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(model_type))
    with torch.no_grad():  # Gemma's norms start at zero; random ones show a (1 + w) mistake
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        source = os.path.join(tokenizer_dir, name)
        if os.path.exists(source):
            shutil.copy(source, directory)
    return directory
