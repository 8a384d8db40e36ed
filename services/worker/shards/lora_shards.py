"""A LoRA adapter cut to one rank's share, as the rank's weights are cut.

Column-parallel products (q/k/v, gate/up) keep the rank's output rows, so an adapter's expansion B
keeps the same rows and its shrink A stays whole. Row-parallel products (attention output, down)
see only the rank's input columns: A keeps those columns, B stays whole, and the rank's
`x_r A_r^T B^T` is added to its partial product before the all-reduce sums the ranks
(`paged/lora_attach.py` wraps the local product inside `RowParallel`), which gives `x A^T B^T`.
"""

from __future__ import annotations

from ztgi.services.worker.lora.adapter_weights import AdapterWeights
from ztgi.services.worker.shards.shard_plan import ShardPlan


def shard_adapter(weights: AdapterWeights, plan: ShardPlan) -> AdapterWeights:
    tensors = {}
    for (layer, module), (a, scaled_bt) in weights.tensors.items():
        rows, columns = plan.output_rows(module), plan.input_columns(module)
        if rows is not None:  # B^T is [rank, out]: the rank's output rows are its columns
            scaled_bt = scaled_bt.index_select(1, rows).contiguous()
        if columns is not None:
            a = a[:, columns].contiguous()
        tensors[(layer, module)] = (a, scaled_bt)
    return AdapterWeights(weights.spec, tensors)
