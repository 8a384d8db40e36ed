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
    if fused is not None:
        sizes = plan.sizes
        q_size, kv_size = sizes.num_heads * sizes.head_dim, sizes.num_kv_heads * sizes.head_dim
        rows = _rows_of_parts([(0, plan.query_rows), (q_size, plan.kv_rows), (q_size + kv_size, plan.kv_rows)])
        _keep_rows(fused, rows)
    else:
        _keep_rows(attention.q_proj, _range(plan.query_rows))
        _keep_rows(attention.k_proj, _range(plan.kv_rows))
        _keep_rows(attention.v_proj, _range(plan.kv_rows))
    _keep_columns(attention.o_proj, plan.query_rows)


def _shard_mlp(mlp: TransformersModule, plan: ShardPlan) -> None:
    fused = getattr(mlp, "gate_up_proj", None)  # Phi-3: gate then up in one weight
    if fused is not None:
        size = plan.sizes.intermediate_size
        _keep_rows(fused, _rows_of_parts([(0, plan.intermediate), (size, plan.intermediate)]))
    else:
        _keep_rows(mlp.gate_proj, _range(plan.intermediate))
        _keep_rows(mlp.up_proj, _range(plan.intermediate))
    _keep_columns(mlp.down_proj, plan.intermediate)


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


def _range(rows: slice) -> torch.Tensor:
    return torch.arange(rows.start, rows.stop)


def _rows_of_parts(parts: list[tuple[int, slice]]) -> torch.Tensor:
    """Row indices of each stacked part's slice, the part starting at its offset."""
    return torch.cat([torch.arange(offset + rows.start, offset + rows.stop) for offset, rows in parts])


def _keep_rows(linear: TransformersModule, rows: torch.Tensor) -> None:
    linear.weight.data = linear.weight.detach().index_select(0, rows.to(linear.weight.device))
    if getattr(linear, "bias", None) is not None:
        linear.bias.data = linear.bias.detach().index_select(0, rows.to(linear.bias.device))
    linear.out_features = int(rows.numel())


def _keep_columns(linear: TransformersModule, columns: slice) -> None:
    linear.weight.data = linear.weight.detach()[:, columns].contiguous()
    linear.in_features = columns.stop - columns.start
