"""A loaded `transformers` causal LM cut down, in place, to one rank's share (`ShardPlan`).

Column-parallel products keep the rank's output rows (q/k/v by heads, gate/up by intermediate
rows), row-parallel ones the matching input columns (the attention output by query heads, down by
intermediate columns); the embedding and head keep the rank's vocabulary rows. The config then
describes the rank's model (its head counts and intermediate size), so the native forwards build
from it unchanged, and `parallel_layers.parallelize` adds the collectives. The full tensors are
released as each is replaced, so a rank holds about 1/N of the layer weights.
"""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.transformers_module import TransformersModule
from ztgi.services.worker.shards.shard_plan import ShardPlan


def shard_module(module: TransformersModule, plan: ShardPlan) -> None:
    """Replaces every sharded weight of `module` by the rank's part and updates its config."""
    decoder = module.model
    for block in decoder.layers:
        _shard_attention(block.self_attn, plan)
        _shard_mlp(block.mlp, plan)
    _shard_vocabulary(module, plan)
    config = module.config.get_text_config(decoder=True)
    config.head_dim = plan.sizes.head_dim  # before the head counts it would otherwise be derived from
    config.num_attention_heads = plan.num_heads
    config.num_key_value_heads = plan.num_kv_heads
    config.intermediate_size = plan.sizes.intermediate_size // plan.num_shard


def _shard_attention(attention: TransformersModule, plan: ShardPlan) -> None:
    fused = getattr(attention, "qkv_proj", None)  # Phi-3: q, k and v stacked in one weight
    for name in ("qkv_proj",) if fused is not None else ("q_proj", "k_proj", "v_proj"):
        _keep_rows(getattr(attention, name), plan.output_rows(name))
    _keep_columns(attention.o_proj, plan.input_columns("o_proj"))


def _shard_mlp(mlp: TransformersModule, plan: ShardPlan) -> None:
    fused = getattr(mlp, "gate_up_proj", None)  # Phi-3: gate then up in one weight
    for name in ("gate_up_proj",) if fused is not None else ("gate_proj", "up_proj"):
        _keep_rows(getattr(mlp, name), plan.output_rows(name))
    _keep_columns(mlp.down_proj, plan.input_columns("down_proj"))


def _shard_vocabulary(module: TransformersModule, plan: ShardPlan) -> None:
    """The rank's rows of the embedding and of the head (once, where they are tied), zero rows
    added where the last rank's range runs past the vocabulary."""
    embedding, head = module.model.embed_tokens, module.lm_head
    tied = head.weight is embedding.weight
    for linear in (embedding,) if tied else (embedding, head):
        weight = linear.weight.detach()
        part = weight[plan.vocab]
        missing = plan.vocab_per_rank - part.shape[0]
        if missing:
            part = torch.cat([part, part.new_zeros(missing, part.shape[1])])
        linear.weight.data = part.clone()


def _keep_rows(linear: TransformersModule, rows: torch.Tensor | None) -> None:
    assert rows is not None, "a column-parallel module"
    linear.weight.data = linear.weight.detach().index_select(0, rows.to(linear.weight.device))
    if getattr(linear, "bias", None) is not None:
        linear.bias.data = linear.bias.detach().index_select(0, rows.to(linear.bias.device))
    linear.out_features = int(rows.numel())


def _keep_columns(linear: TransformersModule, columns: slice | None) -> None:
    assert columns is not None, "a row-parallel module"
    linear.weight.data = linear.weight.detach()[:, columns].contiguous()
    linear.in_features = columns.stop - columns.start
