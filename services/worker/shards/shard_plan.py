"""Which share of a model each rank of a tensor-parallel group holds (Megatron's split).

Query heads, the MLP's intermediate size and the vocabulary are cut into `num_shard` equal ranges;
KV heads too where there are at least as many as ranks, else each KV head is held by
`num_shard / kv_heads` ranks (vLLM's replication), the ones whose query heads read it.
"""

from __future__ import annotations

import dataclasses

import torch

from ztgi.services.worker.layers.transformers_module import TransformersConfig


@dataclasses.dataclass(frozen=True)
class ModelSizes:
    """The sizes a split must divide."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def of(cls, config: TransformersConfig) -> ModelSizes:
        num_heads = int(config.num_attention_heads)
        return cls(num_heads=num_heads,
                   num_kv_heads=int(getattr(config, "num_key_value_heads", None) or num_heads),
                   head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // num_heads),
                   intermediate_size=int(config.intermediate_size), vocab_size=int(config.vocab_size))

    def fits(self, num_shard: int) -> bool:
        kv_split = (self.num_kv_heads % num_shard == 0 if self.num_kv_heads >= num_shard
                    else num_shard % self.num_kv_heads == 0)
        return (self.num_heads % num_shard == 0 and kv_split and self.intermediate_size % num_shard == 0)

    def shard_counts(self, limit: int = 64) -> list[int]:
        """The group sizes up to `limit` this model splits into."""
        return [n for n in range(1, min(limit, self.num_heads) + 1) if self.fits(n)]


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `num_shard`: the index ranges of its heads, intermediate rows and vocabulary."""

    sizes: ModelSizes
    rank: int
    num_shard: int

    @classmethod
    def for_rank(cls, config: TransformersConfig, rank: int, num_shard: int) -> ShardPlan:
        check_num_shard(config, num_shard)
        if not 0 <= rank < num_shard:
            raise ValueError(f"rank {rank} is not one of a group of {num_shard}")
        return cls(ModelSizes.of(config), rank, num_shard)

    @property
    def num_heads(self) -> int:
        return self.sizes.num_heads // self.num_shard

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.sizes.num_kv_heads // self.num_shard)

    @property
    def first_head(self) -> int:
        return self.rank * self.num_heads

    @property
    def first_kv_head(self) -> int:
        """Where KV heads are fewer than ranks, the one head the rank's query heads read."""
        if self.sizes.num_kv_heads >= self.num_shard:
            return self.rank * self.num_kv_heads
        return self.rank // (self.num_shard // self.sizes.num_kv_heads)

    @property
    def intermediate(self) -> slice:
        size = self.sizes.intermediate_size // self.num_shard
        return slice(self.rank * size, (self.rank + 1) * size)

    @property
    def vocab_per_rank(self) -> int:
        """Rows of the embedding and head per rank; the last rank's range may run past the vocabulary
        (its missing rows are zeros, and the gathered logits are cut back)."""
        return -(-self.sizes.vocab_size // self.num_shard)

    @property
    def vocab(self) -> slice:
        size = self.vocab_per_rank
        return slice(self.rank * size, min((self.rank + 1) * size, self.sizes.vocab_size))

    def heads(self, first: int, count: int) -> slice:
        """Rows of a projection's output for heads `first .. first + count`."""
        dim = self.sizes.head_dim
        return slice(first * dim, (first + count) * dim)

    @property
    def query_rows(self) -> slice:
        return self.heads(self.first_head, self.num_heads)

    @property
    def kv_rows(self) -> slice:
        return self.heads(self.first_kv_head, self.num_kv_heads)


    def output_rows(self, module: str) -> torch.Tensor | None:
        """The rows of a decoder layer's module (PEFT's name) the rank holds, None where it holds
        every row (the row-parallel products)."""
        sizes = self.sizes
        q_size, kv_size = sizes.num_heads * sizes.head_dim, sizes.num_kv_heads * sizes.head_dim
        parts = {"q_proj": [(0, self.query_rows)], "k_proj": [(0, self.kv_rows)], "v_proj": [(0, self.kv_rows)],
                 "qkv_proj": [(0, self.query_rows), (q_size, self.kv_rows), (q_size + kv_size, self.kv_rows)],
                 "gate_proj": [(0, self.intermediate)], "up_proj": [(0, self.intermediate)],
                 "gate_up_proj": [(0, self.intermediate), (sizes.intermediate_size, self.intermediate)]}.get(module)
        if parts is None:
            return None
        return torch.cat([torch.arange(offset + rows.start, offset + rows.stop) for offset, rows in parts])

    def input_columns(self, module: str) -> slice | None:
        """The input columns of a row-parallel module the rank holds; None for the others."""
        return {"o_proj": self.query_rows, "down_proj": self.intermediate}.get(module)


def check_num_shard(config: TransformersConfig, num_shard: int) -> None:
    """ValueError unless the model splits into `num_shard` ranks, naming the sizes and counts that do."""
    if num_shard < 1:
        raise ValueError(f"--num-shard must be >= 1, got {num_shard}")
    sizes = ModelSizes.of(config)
    if not sizes.fits(num_shard):
        raise ValueError(
            f"--num-shard {num_shard} does not split this model ({sizes.num_heads} query heads, "
            f"{sizes.num_kv_heads} KV heads, intermediate size {sizes.intermediate_size}): "
            f"it splits into {', '.join(map(str, sizes.shard_counts()))}")
