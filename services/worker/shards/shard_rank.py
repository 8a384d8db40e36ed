"""What a rank process of a worker group knows of its place: the group's collectives and its share."""

from __future__ import annotations

import dataclasses

from ztgi.services.worker.shards.shard_group import ShardGroup
from ztgi.services.worker.shards.shard_plan import ShardPlan


@dataclasses.dataclass(frozen=True)
class ShardRank:
    group: ShardGroup
    plan: ShardPlan
    lora_targets: dict[str, list[int]]  # the whole model's adapter targets: adapters are checked against them

    @property
    def is_leader(self) -> bool:
        """Rank 0 talks to the scheduler and relays its commands to the others."""
        return self.group.rank == 0
