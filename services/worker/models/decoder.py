"""A decoder-only transformer's forward over a flat, unpadded paged step, assembled from `layers/`.

Every family served natively here is this loop with different parts: Llama-style blocks
(`x + attn(norm(x))`, `x + mlp(norm(x))`) or Gemma's sandwich (a norm after attention and after the
MLP too), per-layer sliding windows and rotary bases, and optional soft-capping of the logits.
`families.py` says which parts each `model_type` uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention
from ztgi.services.worker.layers.embedding import Embedding, replace_rows
from ztgi.services.worker.layers.kv_pool import KVPool
from ztgi.services.worker.layers.mlp import GatedMLP
from ztgi.services.worker.layers.norm import RMSNorm
from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.qkv_projection import QKVProjection
from ztgi.services.worker.layers.rotary import Rotary, rotate
from ztgi.services.worker.layers.soft_cap import soft_cap
from ztgi.services.worker.lora.lora_linear import LoraStep


@dataclasses.dataclass(frozen=True)
class DecoderLayer:
    """One block: `x + post_attention(attn(attention_norm(x)))`, then the same for the MLP."""

    attention_norm: RMSNorm
    qkv: QKVProjection
    output: Callable[[torch.Tensor], torch.Tensor]
    mlp_norm: RMSNorm
    mlp: GatedMLP
    post_attention_norm: RMSNorm | None = None  # Gemma's sandwich norms
    post_mlp_norm: RMSNorm | None = None
    window: int | None = None  # sliding-window layer: attends to this many positions
    rotary_type: str | None = None  # Gemma 3: which of the rotary bases


@dataclasses.dataclass(frozen=True)
class Decoder:
    """The whole model's parts."""

    embedding: Embedding | Callable[[torch.Tensor], torch.Tensor]  # a shard's: vocab-parallel
    rotary: Rotary
    layers: list[DecoderLayer]
    norm: RMSNorm
    lm_head: PackedLinear | Callable[[torch.Tensor], torch.Tensor]  # a shard's: its logits gathered
    attention: PagedAttention
    final_softcap: float | None = None


class PagedDecoderForward:
    """Logits of chosen rows of a flat step, writing the step's keys and values into the pool."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.attention = decoder.attention
        self.lora: LoraStep | None = None  # the step's LoRA adapters (paged/lora_attach.py), if any

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: AttentionInputs,
                 pool: KVPool, logit_rows: torch.Tensor,
                 replaced: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits `[len(logit_rows), vocab]`; `input_ids` is `[tokens]`, `positions` `[tokens]` (or
        `[3, tokens]`, multimodal rotary); `replaced`: rows whose embeddings are given (images')."""
        return self.logits_and_hidden(input_ids, positions, inputs, pool, logit_rows, None, replaced)[0]

    def logits_and_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: AttentionInputs,
                          pool: KVPool, logit_rows: torch.Tensor, hidden_rows: torch.Tensor | None,
                          replaced: tuple[torch.Tensor, torch.Tensor] | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits, and the final norm's output at `hidden_rows` (`[len(hidden_rows), hidden]`,
        what embeddings pool), None without rows."""
        d = self.decoder
        x = replace_rows(d.embedding(input_ids), replaced)
        rotations = {kind: d.rotary.cos_sin(x, positions, kind) for kind in {layer.rotary_type for layer in d.layers}}
        windowed = {window: inputs.windowed(window) for window in {layer.window for layer in d.layers}}
        for index, layer in enumerate(d.layers):
            attended = self._attention(layer, index, x, rotations[layer.rotary_type], windowed[layer.window], pool)
            x = x + (layer.post_attention_norm(attended) if layer.post_attention_norm else attended)
            hidden = layer.mlp(layer.mlp_norm(x))
            x = x + (layer.post_mlp_norm(hidden) if layer.post_mlp_norm else hidden)
        pooled = d.norm(x.index_select(0, hidden_rows)) if hidden_rows is not None else None
        return soft_cap(d.lm_head(d.norm(x.index_select(0, logit_rows))), d.final_softcap), pooled

    def _attention(self, layer: DecoderLayer, index: int, x: torch.Tensor,
                   rotation: tuple[torch.Tensor, torch.Tensor], inputs: AttentionInputs,
                   pool: KVPool) -> torch.Tensor:
        q, k, v = layer.qkv(layer.attention_norm(x))
        cos, sin = rotation
        return layer.output(self.decoder.attention(index, rotate(q, cos, sin), rotate(k, cos, sin), v, pool, inputs))
