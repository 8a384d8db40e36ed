"""A Llama model's weights as ztgi's forwards read them: fused q/k/v and gate/up, packed linears.

Both Llama forwards take these: the padded engine's `LlamaForward` (`padded/llama_forward.py`) and
the paged engine's `PagedLlamaForward` (`models/llama.py`), so their weights and per-token
arithmetic are the same and only attention differs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.rotary import Rotary
from ztgi.services.worker.layers.transformers_module import TransformersConfig, TransformersModule

Linear = Callable[[torch.Tensor], torch.Tensor]  # PackedLinear, or a quantized layer


def supports(config: TransformersConfig) -> bool:
    """Whether `config` describes a model this forward computes exactly (plain Llama blocks)."""
    return (getattr(config, "model_type", None) == "llama"
            and getattr(config, "hidden_act", None) == "silu"
            and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False)
            and getattr(config, "pretraining_tp", 1) == 1)


@dataclasses.dataclass(frozen=True)
class LlamaLayer:
    """One decoder block's weights: norms, fused q/k/v, output, fused gate/up, down."""

    attention_norm: torch.Tensor
    qkv: Linear
    output: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class LlamaWeights:
    """The embedding (`embed`: token ids to rows), transformers' rotary module, the layers, the final
    norm and the head, with the model's dimensions; `linear` makes a layer of weights stacked by rows
    (packed by default), and the embedding where it has an `embedding()` (`StoredLinearFactory`)."""

    def __init__(self, model: TransformersModule, linear: Callable[..., Linear] | None = None) -> None:
        config = model.config
        if not supports(config):
            raise TypeError(f"{type(model).__name__} is not a plain Llama model")
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.intermediate_size = config.intermediate_size
        self.eps = config.rms_norm_eps
        decoder = model.model
        self.rotary = Rotary(decoder.rotary_emb)  # transformers' own: every rope scaling it knows
        self.hidden_size = config.hidden_size
        linear = linear or _packed  # weights stacked by rows -> a layer (quantized_linear.LinearFactory)
        embedding = getattr(linear, "embedding", None)  # a GGUF as stored: rows read from the file
        self.embed: Callable[[torch.Tensor], torch.Tensor] = (
            embedding() if embedding is not None
            else functools.partial(F.embedding, weight=decoder.embed_tokens.weight.detach().clone()))
        self.layers = [_layer(block, linear) for block in decoder.layers]
        self.norm = decoder.norm.weight.detach().clone()
        self.lm_head = linear(model.lm_head.weight)


def _layer(block: TransformersModule, linear: Callable[..., Linear]) -> LlamaLayer:
    attention, mlp = block.self_attn, block.mlp
    return LlamaLayer(
        attention_norm=block.input_layernorm.weight.detach().clone(),
        qkv=linear(attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight),
        output=linear(attention.o_proj.weight),
        mlp_norm=block.post_attention_layernorm.weight.detach().clone(),
        gate_up=linear(mlp.gate_proj.weight, mlp.up_proj.weight),
        down=linear(mlp.down_proj.weight),
    )


def _packed(*weights: torch.Tensor) -> PackedLinear:
    return PackedLinear(torch.cat(weights))
