"""The Llama forward over a flat, unpadded step: every request's new tokens in one `[tokens, hidden]`.

The weights and the per-token arithmetic are the padded backend's `LlamaForward` (fused q/k/v and
gate/up, packed linears, transformers' rotary embedding); only attention differs: keys and values
go to the pool's slots and queries attend over block tables (`PagedAttention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from services.worker.llama_forward import Linear, LlamaForward, LlamaLayer, rms_norm, rotate
from services.worker.paged.attention import AttentionInputs, PagedAttention
from services.worker.paged.kv_pool import KVPool
from services.worker.transformers_module import TransformersModule


class PagedLlamaForward:
    """Logits of chosen rows of a flat step, writing the step's keys and values into the pool."""

    def __init__(self, module: TransformersModule, linear: Callable[..., Linear] | None = None) -> None:
        self.weights = LlamaForward(module, linear)
        w = self.weights
        self.attention = PagedAttention(w.num_heads, w.num_kv_heads, w.head_dim)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: AttentionInputs,
                 pool: KVPool, logit_rows: torch.Tensor) -> torch.Tensor:
        """Logits `[len(logit_rows), vocab]`; `input_ids`/`positions` are `[tokens]`."""
        w = self.weights
        x = F.embedding(input_ids, w.embedding)
        cos, sin = (t[0].unsqueeze(1) for t in w.rotary(x[None], positions[None]))  # [tokens, 1, head_dim]
        for index, layer in enumerate(w.layers):
            x = x + self._attention(layer, index, x, cos, sin, inputs, pool)
            x = x + w.mlp(layer, x)
        x = x.index_select(0, logit_rows)
        return w.lm_head(rms_norm(x, w.norm, w.eps))

    def _attention(self, layer: LlamaLayer, index: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   inputs: AttentionInputs, pool: KVPool) -> torch.Tensor:
        w = self.weights
        num_tokens = x.shape[0]
        hidden = rms_norm(x, layer.attention_norm, w.eps)
        qkv = layer.qkv(hidden)
        num_qk_heads = w.num_heads + w.num_kv_heads  # queries and keys side by side: one rotation for both
        qk = rotate(qkv[:, :num_qk_heads * w.head_dim].view(num_tokens, num_qk_heads, w.head_dim), cos, sin)
        q, k = qk[:, :w.num_heads], qk[:, w.num_heads:]
        v = qkv[:, num_qk_heads * w.head_dim:].view(num_tokens, w.num_kv_heads, w.head_dim)
        return layer.output(self.attention(index, q, k, v, pool, inputs))
