"""A worker group's processes (`--num-shard N`): rank 0 checks the split, starts the other ranks and
relays the scheduler's commands to them; every rank joins the collectives and takes its share of
the cores; the other ranks run what rank 0 relays (`FollowerLoop`).

Ranks are processes of one host, as TGI's shards are: rank 0 binds the rendezvous
(`MASTER_ADDR`/`MASTER_PORT`, TGI's variables; a free port by default) and the command relay, starts
ranks 1 .. N-1 with the same flags, and joins the group with them before anyone loads the model, so
a rank that cannot reach its peers fails at start within the timeout, not at the first step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

import torch
import zmq
from transformers import AutoConfig

from ztgi.common.codec import decode_frames
from ztgi.common.free_ports import free_port
from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.messages import WarmupResult
from ztgi.common.model_source import resolve_model
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.engine import COMMANDS, Engine
from ztgi.services.worker.models.loading import resolve_device
from ztgi.services.worker.shards.command_relay import RESET, CommandRelay, RelayedCommands
from ztgi.services.worker.shards.rank_processes import RELAY_ENV, RankProcesses, die_with_parent
from ztgi.services.worker.shards.shard_group import GroupAddress, ShardGroup
from ztgi.services.worker.shards.shard_plan import check_num_shard
from ztgi.services.worker.thread_governor import usable_cpus

logger = logging.getLogger(__name__)


class GroupLeader:
    """Rank 0: the relay, the other ranks' processes, the group."""

    def __init__(self, config: WorkerConfig, argv: Sequence[str], exit_on_loss: bool = True) -> None:
        """`exit_on_loss`: a worker process exits at once when a rank does; an offline `LLM` (False)
        sees its next step fail (`ShardGroupLost`) instead."""
        size = config.num_shard
        source = resolve_model(config.model_id)
        check_num_shard(AutoConfig.from_pretrained(source.path).get_text_config(decoder=True), size)
        address = group_address()
        self.lost = threading.Event()
        self.context = zmq.Context()
        self.relay = CommandRelay(self.context, "127.0.0.1")
        self.ranks = RankProcesses(argv, size, address, self.relay.endpoint, self.lost, exit_on_loss)
        logger.info("worker group of %d ranks: rendezvous at %s:%d", size, address.host, address.port)
        try:
            self.group = join(config, 0, address, self.lost)
        except BaseException:
            self.stop()
            raise

    def wait_for_ranks(self) -> None:
        self.relay.wait_for_ranks(self.group.size - 1, self.lost)

    def stop(self) -> None:
        """The other ranks stopped, the group left (a later group in this process can form again)."""
        self.ranks.stop()
        if getattr(self, "group", None) is not None:
            self.group.close()
        if not self.context.closed:
            self.context.destroy(linger=0)


def follower(config: WorkerConfig, rank: int) -> tuple[ShardGroup, RelayedCommands]:
    """A rank other than 0: its group and the relay it listens to."""
    die_with_parent()
    group = join(config, rank, group_address())
    return group, RelayedCommands(zmq.Context(), os.environ[RELAY_ENV], rank)


def join(config: WorkerConfig, rank: int, address: GroupAddress,
         lost: threading.Event | None = None) -> ShardGroup:
    device = resolve_device(config.device)
    if device.type == "cpu":
        share_cores(rank, config.num_shard, config.num_threads)
    else:  # one GPU per rank: "cuda" means the rank's own from here on
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return ShardGroup(rank, config.num_shard, address, config.shard_timeout_s, device, lost)


def group_address() -> GroupAddress:
    """`MASTER_ADDR`/`MASTER_PORT` as TGI sets them; rank 0 picks a free port when none is set (and
    passes it to the ranks it starts)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "0")) or free_port()
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, str(port)
    return GroupAddress(host, port)


def share_cores(rank: int, size: int, num_threads: int | None) -> None:
    """The rank's own run of the usable cores (as one NUMA node each would be) and its share of the
    worker's intra-op threads (`--num-threads`, else one per usable core); at least one each."""
    cpus = sorted(usable_cpus())
    each = len(cpus) // size
    if each >= 1:
        os.sched_setaffinity(0, cpus[rank * each:(rank + 1) * each])
    threads = max(1, (num_threads or len(cpus)) // size)
    torch.set_num_threads(threads)
    logger.info("rank %d: %d intra-op thread(s)%s", rank, threads,
                f" on cores {cpus[rank * each:(rank + 1) * each]}" if each >= 1 else "")


class FollowerLoop:
    """Until the process is stopped (rank 0 stops its ranks as it exits, and the kernel kills them
    when it dies) or a collective fails (`ShardGroupLost` ends `run`)."""

    def __init__(self, engine: Engine, commands: RelayedCommands) -> None:
        self.engine = engine
        self.commands = commands

    def run(self) -> None:
        self.commands.ready()
        while True:
            self.serve(self.commands.receive())

    def serve(self, frames: list[bytes]) -> None:
        if frames == [RESET]:
            self.engine.cache.clear()
            return
        command = decode_frames(frames, COMMANDS)  # rank 0 relays only frames it decoded itself
        try:
            answer = self.engine.run(command)
        except Exception:  # as rank 0's engine loop: logged, and the next command runs
            logger.exception("command %s failed", type(command).__name__)
            return
        if isinstance(answer, WarmupResult):
            freeze_startup_objects()
        self.engine.release_freed_memory()
