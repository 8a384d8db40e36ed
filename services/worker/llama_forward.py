"""The forward pass of Llama-architecture models, written for serving (TGI keeps its own modeling too).

Same weights and the same arithmetic as `transformers`' `LlamaForCausalLM`, with less around it:
q/k/v are one matrix product and gate/up another, every linear weight is packed for the CPU's
fastest kernel (`PackedLinear`), keys and values go straight into the batch's `KVCache` buffers,
the attention mask is built once per step rather than per layer, and there are no hooks, output
records or cache objects per call. On SmolLM2-135M this step is several times cheaper than the
`transformers` module's on 2 CPU cores (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ztgi.services.worker.kv_cache import KVCache
from ztgi.services.worker.packed_linear import PackedLinear
from ztgi.services.worker.transformers_module import TransformersConfig, TransformersModule

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


class LlamaForward:
    """Logits for a padded batch, writing the new keys and values into its cache."""

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
        self.rotary = decoder.rotary_emb  # transformers' own: every rope scaling it knows
        self.embedding = decoder.embed_tokens.weight.detach().clone()
        linear = linear or _packed  # weights stacked by rows -> a layer (quantized_linear.LinearFactory)
        self.layers = [_layer(block, linear) for block in decoder.layers]
        self.norm = decoder.norm.weight.detach().clone()
        self.lm_head = linear(model.lm_head.weight)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                 cache: KVCache, num_logits: int) -> torch.Tensor:
        """Logits `[batch, positions, vocab]` of the last `num_logits` positions (0: all of them).

        `input_ids`/`position_ids` are `[batch, new]`; `attention_mask` `[batch, cached + new]`
        (1 for real tokens); the new keys and values are written after the cached ones, which the
        caller commits once the step succeeded.
        """
        num_new = input_ids.shape[1]
        x = F.embedding(input_ids, self.embedding)
        cos, sin = (t.unsqueeze(1) for t in self.rotary(x, position_ids))  # [batch, 1, new, head_dim]
        keep = _attention_keep(attention_mask, cache.num_positions, num_new)
        for index, layer in enumerate(self.layers):
            x = x + self._attention(layer, index, x, cos, sin, keep, cache)
            x = x + self.mlp(layer, x)
        if num_logits:
            x = x[:, -num_logits:]
        return self.lm_head(rms_norm(x, self.norm, self.eps))

    def _attention(self, layer: LlamaLayer, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   keep: torch.Tensor, cache: KVCache) -> torch.Tensor:
        batch_size, num_new, _ = x.shape
        hidden = rms_norm(x, layer.attention_norm, self.eps)
        q, k, v = layer.qkv(hidden).split(
            [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim],
            dim=-1)
        q = rotate(q.view(batch_size, num_new, self.num_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = rotate(k.view(batch_size, num_new, self.num_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = v.view(batch_size, num_new, self.num_kv_heads, self.head_dim).transpose(1, 2)
        keys, values = cache.write(index, k, v)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=keep,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return layer.output(out.transpose(1, 2).reshape(batch_size, num_new, -1))

    def mlp(self, layer: LlamaLayer, x: torch.Tensor) -> torch.Tensor:
        hidden = rms_norm(x, layer.mlp_norm, self.eps)
        gate, up = layer.gate_up(hidden).split(self.intermediate_size, dim=-1)
        return layer.down(F.silu(gate) * up)


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm rounded as transformers' `LlamaRMSNorm` rounds it (normalized in float32, cast, then
    scaled), so bfloat16 greedy texts equal transformers' in bfloat16; in float32 it is `F.rms_norm`."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, as transformers' `apply_rotary_pos_emb` (halves, not interleaved)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention_keep(attention_mask: torch.Tensor, num_cached: int, num_new: int) -> torch.Tensor:
    """Which keys each new position attends to, `[batch, 1, new, cached + new]`, for every layer.

    A real token sees the real tokens up to itself. A padding position (left padding in prefill)
    sees only itself, so no row of the softmax is empty; its output is never used.
    """
    keep = attention_mask.bool()[:, None, None, :]
    if num_new == 1:
        return keep
    device = attention_mask.device
    key_positions = torch.arange(num_cached + num_new, device=device)
    query_positions = torch.arange(num_cached, num_cached + num_new, device=device)[:, None]
    return (keep & (key_positions <= query_positions)) | (key_positions == query_positions)
