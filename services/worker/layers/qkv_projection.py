"""The attention's input projection: q, k and v from one matrix product, with the families' extras
(Qwen2's biases, Qwen3's and Gemma 3's per-head QK-norm)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ztgi.services.worker.layers.norm import RMSNorm
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.transformers_module import TransformersModule


class QKVProjection:
    """`[tokens, hidden]` to q `[tokens, heads, head_dim]` and k, v `[tokens, kv_heads, head_dim]`."""

    def __init__(self, attention: TransformersModule, num_heads: int, num_kv_heads: int, head_dim: int,
                 norm_offset: bool = False) -> None:
        self.sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        self.head_dim = head_dim
        projections = _projections(attention)
        self.linear: Callable[[torch.Tensor], torch.Tensor] = PackedLinear(torch.cat([p.weight for p in projections]))
        biases = [p.bias for p in projections]
        self.bias = torch.cat(biases).detach().clone() if all(b is not None for b in biases) else None
        q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        self.q_norm = RMSNorm(q_norm, norm_offset) if q_norm is not None else None
        self.k_norm = RMSNorm(k_norm, norm_offset) if k_norm is not None else None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.linear(x)
        if self.bias is not None:
            qkv = qkv + self.bias
        q, k, v = (t.view(x.shape[0], -1, self.head_dim) for t in qkv.split(self.sizes, dim=-1))
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return q, k, v


def _projections(attention: TransformersModule) -> list[TransformersModule]:
    """Phi-3 stores q/k/v fused already (`qkv_proj`); the others as three linears."""
    fused = getattr(attention, "qkv_proj", None)
    if fused is not None:
        return [fused]
    return [attention.q_proj, attention.k_proj, attention.v_proj]
