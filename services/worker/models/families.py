"""Which architectures the paged engine serves natively, by `model_type`, and how each is built.

Each family is a choice of parts from `layers/` put into one `Decoder`: Qwen2's biased q/k/v (and
Qwen2-VL's text model's, whose rotary takes (temporal, height, width) positions, `layers/rotary.py`),
Qwen3's and Gemma 3's QK-norm, Mistral's and Gemma's sliding windows, Gemma's `(1 + w)` sandwich
norms, scaled embeddings, query scale and soft-capping, Phi-3's fused projections. Plain Llama keeps
its own forward (`llama.py`), which shares the padded engine's weights (`llama_weights.py`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ztgi.services.worker.layers.attention import PagedAttention
from ztgi.services.worker.layers.embedding import Embedding
from ztgi.services.worker.layers.mlp import ACTIVATIONS, GatedMLP
from ztgi.services.worker.layers.norm import RMSNorm
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.qkv_projection import QKVProjection
from ztgi.services.worker.layers.rotary import Rotary
from ztgi.services.worker.layers.transformers_module import TransformersConfig, TransformersModule
from ztgi.services.worker.models import llama_weights
from ztgi.services.worker.models.decoder import Decoder, DecoderLayer, PagedDecoderForward
from ztgi.services.worker.models.llama import PagedLlamaForward

if TYPE_CHECKING:
    from ztgi.services.worker.layers.quantization.factory import LayerFactory


@dataclasses.dataclass(frozen=True)
class Family:
    """How a `model_type` differs from a Llama block."""

    gemma: bool = False  # (1 + w) norms, sandwich norms, query_pre_attn_scalar, soft-capping
    rotary_by_layer_type: bool = False  # Gemma 3: local and global rope bases


FAMILIES: dict[str, Family] = {
    "mistral": Family(),
    "qwen2": Family(),
    "qwen3": Family(),
    "phi3": Family(),
    "gemma2": Family(gemma=True),
    "gemma3_text": Family(gemma=True, rotary_by_layer_type=True),
    "qwen2_vl_text": Family(),  # Qwen2-VL's text model: Qwen2's blocks, multimodal rotary positions
    "qwen2_5_vl_text": Family(),  # Qwen2.5-VL's: the same
}
SUPPORTED = ("llama", *FAMILIES)
BIASED_QKV = ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text")


def supports(config: TransformersConfig) -> bool:
    """Whether a native paged forward computes `config`'s model exactly."""
    model_type = getattr(config, "model_type", None)
    if model_type == "llama":
        return llama_weights.supports(config)
    return (model_type in FAMILIES
            and _activation(config) in ACTIVATIONS
            and not getattr(config, "mlp_bias", False)
            and (model_type in BIASED_QKV or not getattr(config, "attention_bias", False))
            and not getattr(config, "use_bidirectional_attention", False))


def unsupported_reason(config: TransformersConfig) -> str:
    model_type = getattr(config, "model_type", None)
    if model_type in SUPPORTED:
        return f"this {model_type!r} config uses options the native forward does not compute"
    return f"model type {model_type!r} has no native paged forward (supported: {', '.join(SUPPORTED)})"


def paged_forward(module: TransformersModule,
                  linear: LayerFactory | None = None) -> PagedLlamaForward | PagedDecoderForward:
    """The native paged forward of `module` (a transformers causal LM), its linear layers from
    `linear` (`--quantize`; Llama only for now); TypeError where none fits, ValueError for a
    quantization the family's forward does not take."""
    config = module.config
    if not supports(config):
        raise TypeError(unsupported_reason(config))
    if config.model_type == "llama":
        return PagedLlamaForward(module, linear)
    if linear is not None and linear.quantize != "none":
        raise ValueError(f"--quantize {linear.quantize} is served for Llama models only, not {config.model_type!r}")
    return PagedDecoderForward(_decoder(module, FAMILIES[config.model_type]))


def _decoder(module: TransformersModule, family: Family) -> Decoder:
    config, decoder = module.config, module.model
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    scale = config.query_pre_attn_scalar ** -0.5 if family.gemma else None
    softcap = getattr(config, "attn_logit_softcapping", None) if family.gemma else None
    windows = layer_windows(config)
    layer_types = getattr(config, "layer_types", None) or [None] * len(decoder.layers)
    layers = [_layer(block, family, num_heads, num_kv_heads, head_dim, _activation(config), window,
                     layer_type if family.rotary_by_layer_type else None)
              for block, window, layer_type in zip(decoder.layers, windows, layer_types)]
    return Decoder(
        embedding=Embedding(decoder.embed_tokens),
        rotary=Rotary(decoder.rotary_emb, family.rotary_by_layer_type),
        layers=layers,
        norm=RMSNorm(decoder.norm, family.gemma),
        lm_head=PackedLinear(module.lm_head.weight),
        attention=PagedAttention(num_heads, num_kv_heads, head_dim, scale, softcap),
        final_softcap=getattr(config, "final_logit_softcapping", None))


def _layer(block: TransformersModule, family: Family, num_heads: int, num_kv_heads: int, head_dim: int,
           activation: str | None, window: int | None, rotary_type: str | None) -> DecoderLayer:
    attention, gemma = block.self_attn, family.gemma
    if getattr(attention.o_proj, "bias", None) is not None:
        raise TypeError("an attention output projection with a bias is not computed by the native forward")
    return DecoderLayer(
        attention_norm=RMSNorm(block.input_layernorm, gemma),
        qkv=QKVProjection(attention, num_heads, num_kv_heads, head_dim, norm_offset=gemma),
        output=PackedLinear(attention.o_proj.weight),
        mlp_norm=RMSNorm(block.pre_feedforward_layernorm if gemma else block.post_attention_layernorm, gemma),
        mlp=GatedMLP(block.mlp, activation),
        post_attention_norm=RMSNorm(block.post_attention_layernorm, True) if gemma else None,
        post_mlp_norm=RMSNorm(block.post_feedforward_layernorm, True) if gemma else None,
        window=window, rotary_type=rotary_type)


def layer_windows(config: TransformersConfig) -> list[int | None]:
    """Each layer's sliding window (None: full attention), from `layer_types` where the config has
    them (Gemma 2/3's alternation, Qwen2's `use_sliding_window`), else `sliding_window` for all."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return [window] * config.num_hidden_layers
    return [window if kind == "sliding_attention" else None for kind in layer_types]


def _activation(config: TransformersConfig) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
