"""A rank other than 0: runs every command rank 0 relays, in order, and drops the answers."""

from __future__ import annotations

import logging

from ztgi.common.codec import decode_frames
from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.messages import WarmupResult
from ztgi.services.worker.commands import COMMANDS, run_command
from ztgi.services.worker.engine import Engine
from ztgi.services.worker.shards.command_relay import RESET, RelayedCommands

logger = logging.getLogger(__name__)


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
            answer = run_command(self.engine, command)
        except Exception:  # as rank 0's engine loop: logged, and the next command runs
            logger.exception("command %s failed", type(command).__name__)
            return
        if isinstance(answer, WarmupResult):
            freeze_startup_objects()
        self.engine.release_freed_memory()
