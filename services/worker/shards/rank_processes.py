"""Rank 0 of a worker group starts the other ranks as child processes and watches them.

A worker group is one logical worker: when any rank exits, the group cannot step, so rank 0 stops
the rest; a worker then exits non-zero at once (the scheduler requeues the group's requests as for
any lost worker; the launcher or the container's restart policy starts the group again), and an
offline `LLM` marks the group lost so its next step fails instead. A rank started here dies with
rank 0 (the kernel's parent-death signal), so no rank outlives its group.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from ztgi.common.child_process import stop_process
from ztgi.services.worker.shards.shard_group import GroupAddress

logger = logging.getLogger(__name__)

RANK_ENV = "ZTGI_SHARD_RANK"  # set by rank 0 for the ranks it starts: which rank a process is
RELAY_ENV = "ZTGI_SHARD_RELAY"  # rank 0's command relay, for the other ranks to connect to
PARENT_ENV = "ZTGI_SHARD_PARENT"  # rank 0's pid: a rank whose parent is already gone exits
WATCH_INTERVAL_S = 0.2
STOP_TIMEOUT_S = 5.0
PR_SET_PDEATHSIG = 1


def own_rank() -> int:
    """This process's rank: 0 unless rank 0 started it."""
    return int(os.environ.get(RANK_ENV, "0"))


class RankProcesses:
    """Ranks 1 .. size-1, each `python -m ztgi.services.worker` with the leader's flags."""

    def __init__(self, argv: Sequence[str], size: int, address: GroupAddress, relay: str,
                 lost: threading.Event, exit_on_loss: bool = True) -> None:
        self.processes: dict[int, subprocess.Popen] = {}
        self.stopping = False
        self.lost = lost  # set when a rank exits on its own
        self.exit_on_loss = exit_on_loss
        for rank in range(1, size):
            env = {**os.environ, RANK_ENV: str(rank), RELAY_ENV: relay, PARENT_ENV: str(os.getpid()),
                   "MASTER_ADDR": address.host, "MASTER_PORT": str(address.port), "WORLD_SIZE": str(size),
                   "RANK": str(rank)}
            self.processes[rank] = subprocess.Popen([sys.executable, "-m", "ztgi.services.worker", *argv], env=env)
        self.watcher = threading.Thread(target=self._watch, name="ranks", daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        while not self.stopping:
            for rank, process in self.processes.items():
                code = process.poll()
                if code is not None and not self.stopping:
                    logger.error("rank %d of the group exited (code %s): stopping the group", rank, code)
                    self.lost.set()
                    self.stop()
                    if self.exit_on_loss:
                        os._exit(1)  # the group cannot step without it; rank 0 may be inside a collective
                    return
            time.sleep(WATCH_INTERVAL_S)

    def stop(self) -> None:
        """SIGTERM to every rank still running, then SIGKILL after a while."""
        self.stopping = True
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            stop_process(process, STOP_TIMEOUT_S)


def die_with_parent() -> None:
    """In a rank rank 0 started: the kernel kills it when rank 0 dies (Linux), and it exits now if
    rank 0 is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the first collective after rank 0's death fails instead
        pass
    if str(os.getppid()) != os.environ.get(PARENT_ENV, str(os.getppid())):
        sys.exit(1)
