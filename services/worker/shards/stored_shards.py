"""A rank's share of a GGUF served as stored: the file's blocks sliced as `module_sharding` slices
float weights, by transformers' parameter names.

Output rows (q/k/v by heads, gate/up by intermediate rows, the head by vocabulary rows) slice any
block type; input columns (the attention output, down) slice only on the type's super-block
boundaries (32 weights for Q4_0..Q8_0, 256 for K-quants): a tensor whose rank's columns split a
block is dequantized instead (the layer factory logs it), never refused.
"""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.stored_linear import StoredWeights
from ztgi.services.worker.shards.shard_plan import ShardPlan


class ShardedStoredWeights:
    """`StoredWeights` of one rank, over the whole file's."""

    def __init__(self, weights: StoredWeights, plan: ShardPlan) -> None:
        self.weights, self.plan = weights, plan

    def type_name(self, name: str) -> str:
        return self.weights.type_name(name)

    def block_codes(self, name: str) -> BlockCodes | None:
        codes = self.weights.block_codes(name)
        if codes is None:
            return None
        rows, columns = self._share(name)
        if isinstance(rows, slice) and self._short(rows):
            return None  # the last rank's head rows padded with zeros: as floats
        if rows is not None:
            codes = codes.permuted_rows(rows if isinstance(rows, torch.Tensor) else torch.arange(rows.start, rows.stop))
        return codes if columns is None else codes.columns(columns.start, columns.stop)

    def float(self, name: str) -> torch.Tensor:
        values = self.weights.float(name)
        rows, columns = self._share(name)
        if rows is not None:
            values = values[rows]
        if isinstance(rows, slice) and self._short(rows):
            values = torch.cat([values, values.new_zeros(self.plan.vocab_per_rank - values.shape[0], values.shape[1])])
        return values if columns is None else values[:, columns].contiguous()

    def embedding_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the rank's vocabulary range, for ids counted from its start (`VocabParallelEmbedding`)."""
        return self.weights.embedding_rows(token_ids + self.plan.vocab.start)

    def _short(self, rows: slice) -> bool:
        return rows.stop - rows.start < self.plan.vocab_per_rank

    def _share(self, name: str) -> tuple[torch.Tensor | slice | None, slice | None]:
        """The rank's rows and columns of the named matrix (None: all)."""
        if name in ("lm_head.weight", "model.embed_tokens.weight"):
            return self.plan.vocab, None
        parts = name.split(".")
        if len(parts) < 2 or parts[-1] != "weight":
            return None, None
        return self.plan.output_rows(parts[-2]), self.plan.input_columns(parts[-2])
