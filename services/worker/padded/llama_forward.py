"""The padded engine's forward pass of Llama-architecture models, written for serving (TGI keeps its
own modeling too).

Same weights and the same arithmetic as `transformers`' `LlamaForCausalLM`, with less around it:
q/k/v are one matrix product and gate/up another, every linear weight is packed for the CPU's
fastest kernel (`PackedLinear`), keys and values go straight into the batch's `KVCache` buffers,
the attention mask is built once per step rather than per layer, and there are no hooks, output
records or cache objects per call. The weights are `LlamaWeights` (`models/llama_weights.py`), which
the paged engine's Llama forward reads too. On SmolLM2-135M this step is several times cheaper than the
`transformers` module's on 2 CPU cores (BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.norm import rms_norm
from ztgi.services.worker.layers.rotary import rotate
from ztgi.services.worker.models.llama_weights import LlamaLayer, LlamaWeights
from ztgi.services.worker.padded.kv_cache import KVCache


class LlamaForward(LlamaWeights):
    """Logits for a padded batch, writing the new keys and values into its cache."""

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                 cache: KVCache, num_logits: int) -> torch.Tensor:
        """Logits `[batch, positions, vocab]` of the last `num_logits` positions (0: all of them).

        `input_ids`/`position_ids` are `[batch, new]`; `attention_mask` `[batch, cached + new]`
        (1 for real tokens); the new keys and values are written after the cached ones, which the
        caller commits once the step succeeded.
        """
        num_new = input_ids.shape[1]
        x = self.embed(input_ids)
        cos, sin = (t.unsqueeze(1) for t in self.rotary.module(x, position_ids))  # [batch, 1, new, head_dim]
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
