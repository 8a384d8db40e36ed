"""A tensor-parallel group's collectives, on torch.distributed (gloo on CPU, NCCL on CUDA).

Every rank runs the same steps in the same order, so each collective meets its peers at once; one
that waits past the group's timeout means a rank hung or died, and the group cannot go on: the
collective raises `ShardGroupLost`, which no command handler catches, and the rank exits for the
group to be started again.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from ztgi.services.worker.shards import shared_memory_collectives
from ztgi.services.worker.shards.shared_memory_collectives import SharedMemoryCollectives

logger = logging.getLogger(__name__)


class ShardGroupLost(BaseException):
    """A collective failed or timed out: a peer is gone. A BaseException, like SystemExit, so that the
    engine's per-command error handling (which answers a failed request and goes on) lets it through."""


@dataclasses.dataclass(frozen=True)
class GroupAddress:
    """Where rank 0's rendezvous store listens (torch's `MASTER_ADDR`/`MASTER_PORT`)."""

    host: str
    port: int


class ShardGroup:
    """This process's rank in a group of `size`, joined at construction."""

    def __init__(self, rank: int, size: int, address: GroupAddress, timeout_s: float, device: torch.device,
                 lost: threading.Event | None = None) -> None:
        """`lost`: set (by rank 0's watch on its ranks) when a rank exited: a shared-memory wait ends."""
        self.rank = rank
        self.lost = lost
        self.size = size
        self.device = device
        backend = "nccl" if device.type == "cuda" else "gloo"
        try:
            dist.init_process_group(backend, init_method=f"tcp://{address.host}:{address.port}", rank=rank,
                                    world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as exc:  # torch raises RuntimeError or DistStoreError for an unreachable peer
            raise ShardGroupLost(f"rank {rank} of {size} could not join the group at "
                                 f"{address.host}:{address.port} within {timeout_s:g} s: {exc}") from None
        self.shared = self._shared_memory(address, timeout_s) if device.type == "cpu" else None
        logger.info("rank %d of %d joined the %s group at %s:%d%s", rank, size, backend, address.host, address.port,
                    ", collectives of up to 1 MiB through shared memory" if self.shared else "")

    def _shared_memory(self, address: GroupAddress, timeout_s: float) -> SharedMemoryCollectives | None:
        """The host's shared-memory buffer for small collectives (rank 0 creates it, then removes its
        name once every rank has it mapped), where the protocol holds."""
        if not shared_memory_collectives.available():
            return None
        path = f"/dev/shm/ztgi-group-{address.host}-{address.port}"
        try:
            if self.rank == 0:
                shared = SharedMemoryCollectives(path, self.rank, self.size, timeout_s, create=True, lost=self.lost)
            dist.barrier()
            if self.rank != 0:
                shared = SharedMemoryCollectives(path, self.rank, self.size, timeout_s, create=False, lost=self.lost)
            dist.barrier()
        except Exception as exc:
            raise ShardGroupLost(f"rank {self.rank} of {self.size} could not share {path}: {exc}") from None
        if self.rank == 0:
            os.unlink(path)
        return shared

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place."""
        if self.shared is not None and self.shared.fits(tensor):
            return self._shared("all_reduce", self.shared.all_reduce, tensor)
        self._run("all_reduce", dist.all_reduce, tensor)
        return tensor

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Each rank's `tensor` side by side along the last dimension, rank 0 first."""
        if self.shared is not None and self.shared.fits(tensor):
            return self._shared("all_gather", self.shared.all_gather_last, tensor)
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        self._run("all_gather", dist.all_gather, parts, tensor.contiguous())
        return torch.cat(parts, dim=-1)

    def min_ints(self, *values: int) -> list[int]:
        """Each value's minimum over the ranks (what every rank can meet)."""
        tensor = torch.tensor(values, dtype=torch.int64)
        self._run("all_reduce", dist.all_reduce, tensor, op=dist.ReduceOp.MIN)
        return [int(v) for v in tensor.tolist()]

    def _shared(self, name: str, collective: Callable[[torch.Tensor], torch.Tensor],
                tensor: torch.Tensor) -> torch.Tensor:
        try:
            return collective(tensor.contiguous())
        except TimeoutError as exc:
            raise ShardGroupLost(f"{name} failed on rank {self.rank} of {self.size}: {exc}") from None

    def _run(self, name: str, collective: object, *args: object, **kwargs: object) -> None:
        try:
            collective(*args, **kwargs)  # type: ignore[operator]
        except Exception as exc:
            raise ShardGroupLost(f"{name} failed on rank {self.rank} of {self.size}: {exc}") from None

    def close(self) -> None:
        self.shared = None  # the mapping goes with the last view of it
        if dist.is_initialized():
            dist.destroy_process_group()
