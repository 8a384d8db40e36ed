"""The Llama forward over a flat, unpadded step: every request's new tokens in one `[tokens, hidden]`.

The weights and the per-token arithmetic are the padded engine's `LlamaForward`'s (`LlamaWeights`: fused
q/k/v and gate/up, packed linears, transformers' rotary embedding); only attention differs: keys and values
go to the pool's slots and queries attend over block tables (`PagedAttention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ztgi.services.worker.layers.attention import AttentionInputs, PagedAttention
from ztgi.services.worker.layers.embedding import replace_rows
from ztgi.services.worker.layers.kv_pool import KVPool
from ztgi.services.worker.layers.layer_ops import NativeLayerOps, TorchLayerOps
from ztgi.services.worker.layers.transformers_module import TransformersModule
from ztgi.services.worker.lora.lora_linear import LoraStep
from ztgi.services.worker.models.llama_decode_stack import NativeDecodeStack
from ztgi.services.worker.models.llama_weights import Linear, LlamaLayer, LlamaWeights


class PagedLlamaForward:
    """Logits of chosen rows of a flat step, writing the step's keys and values into the pool.

    Each block adds its residual to the stream and normalizes in one step (`add_rms_norm`), as the
    next block starts, so the elementwise work between the matrix products is three calls a
    block, in C where the layer ops are built (`layers/layer_ops.py`, set by the model with the attention
    kernels) and torch's ops elsewhere. Where every kernel of a layer is C (`--quantize int4`), a
    decode step's layers run in one call instead (`llama_decode_stack.py`), with the same results."""

    def __init__(self, module: TransformersModule, linear: Callable[..., Linear] | None = None) -> None:
        self.weights = LlamaWeights(module, linear)
        w = self.weights
        self.attention = PagedAttention(w.num_heads, w.num_kv_heads, w.head_dim)
        self.ops: TorchLayerOps | NativeLayerOps = TorchLayerOps()
        self.stack: NativeDecodeStack | None = None  # every layer in one C call, where all its kernels are ours
        self.lora: LoraStep | None = None  # the step's LoRA adapters (paged/lora_attach.py), if any

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: AttentionInputs,
                 pool: KVPool, logit_rows: torch.Tensor,
                 replaced: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Logits `[len(logit_rows), vocab]`; `input_ids`/`positions` are `[tokens]`; `replaced`: rows
        whose embeddings are given (images')."""
        return self.logits_and_hidden(input_ids, positions, inputs, pool, logit_rows, None, replaced)[0]

    def logits_and_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: AttentionInputs,
                          pool: KVPool, logit_rows: torch.Tensor, hidden_rows: torch.Tensor | None,
                          replaced: tuple[torch.Tensor, torch.Tensor] | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits, and the final norm's output at `hidden_rows` (`[len(hidden_rows), hidden]`,
        what embeddings pool), None without rows."""
        w, ops = self.weights, self.ops
        x = replace_rows(w.embed(input_ids), replaced)
        cos, sin = w.rotary.cos_sin(x, positions)  # [tokens, 1, head_dim]
        if self.stack is not None and not (self.lora and self.lora.active) and self.stack.accepts(x, inputs):
            x, residual = self.stack.run(x, cos, sin, inputs, pool)
        else:
            x, residual = self._layers(x, cos, sin, inputs, pool)
        hidden, _ = ops.add_rms_norm(x.index_select(0, logit_rows), residual.index_select(0, logit_rows),
                                     w.norm, w.eps)
        pooled = None
        if hidden_rows is not None:
            pooled, _ = ops.add_rms_norm(x.index_select(0, hidden_rows), residual.index_select(0, hidden_rows),
                                         w.norm, w.eps)
        return w.lm_head(hidden), pooled

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inputs: AttentionInputs,
                pool: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer, call by call: the residual stream and the last MLP's output."""
        w, ops = self.weights, self.ops
        residual = None
        for index, layer in enumerate(w.layers):
            hidden, x = ops.add_rms_norm(x, residual, layer.attention_norm, w.eps)
            residual = self._attention(layer, index, hidden, cos, sin, inputs, pool)
            hidden, x = ops.add_rms_norm(x, residual, layer.mlp_norm, w.eps)
            residual = layer.down(ops.silu_mul(layer.gate_up(hidden)))
        assert residual is not None
        return x, residual

    def _attention(self, layer: LlamaLayer, index: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   inputs: AttentionInputs, pool: KVPool) -> torch.Tensor:
        w = self.weights
        num_tokens = hidden.shape[0]
        qkv = layer.qkv(hidden)
        num_qk_heads = w.num_heads + w.num_kv_heads  # queries and keys side by side: one rotation for both
        qk = self.ops.rotate(qkv[:, :num_qk_heads * w.head_dim].view(num_tokens, num_qk_heads, w.head_dim), cos, sin)
        q, k = qk[:, :w.num_heads], qk[:, w.num_heads:]
        v = qkv[:, num_qk_heads * w.head_dim:].view(num_tokens, w.num_kv_heads, w.head_dim)
        return layer.output(self.attention(index, q, k, v, pool, inputs))
