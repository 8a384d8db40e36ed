"""Commands from rank 0 to the other ranks of a worker group, before rank 0 runs each one.

Only rank 0 talks to the scheduler (one registration, one heartbeat, one answer per step); it
forwards each command's frames as received to every other rank over a ROUTER (one message per
step per rank, no re-encoding), so every rank runs the same commands in the same order and keeps
the same batches; their answers are dropped. This is how vLLM v1 and SGLang feed their tensor-parallel
workers; the scheduler's fan-out (TGI's router) would make the scheduler know about ranks and
wait for N answers per step.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from ztgi.common.codec import MAX_MESSAGE_BYTES
from ztgi.services.worker.shards.shard_group import ShardGroupLost

logger = logging.getLogger(__name__)

READY = b"ready"  # a rank -> rank 0: its model is loaded
RESET = b"reset"  # rank 0 -> a rank: the scheduler restarted or dropped the group: drop every batch
PROGRESS_S = 30.0


class CommandRelay:
    """Rank 0's side: bound before the other ranks start, so they can be told where it is."""

    def __init__(self, context: zmq.Context, host: str) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a rank gone is an error, not a silent drop
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self.ranks: list[bytes] = []

    def wait_for_ranks(self, count: int, lost: threading.Event) -> None:
        """Until `count` ranks said they are loaded; ShardGroupLost when one exits meanwhile
        (`RankProcesses` sets `lost`)."""
        started = last_said = time.monotonic()
        while len(self.ranks) < count:
            if lost.is_set():
                raise ShardGroupLost("a rank of the group exited while loading the model")
            if self.socket.poll(1000):
                identity, message = self.socket.recv_multipart()
                if message == READY and identity not in self.ranks:
                    self.ranks.append(identity)
            elif time.monotonic() - last_said >= PROGRESS_S:
                last_said = time.monotonic()
                logger.info("waiting for %d of %d ranks to load the model (%.0f s)", count - len(self.ranks), count,
                            last_said - started)
        logger.info("every rank of the group is loaded")

    def send(self, frames: list[bytes]) -> None:
        for identity in self.ranks:
            try:
                self.socket.send_multipart([identity, *frames])
            except zmq.ZMQError as exc:  # ROUTER_MANDATORY: the rank's connection is gone
                raise ShardGroupLost(f"cannot relay a command to {identity.decode()}: {exc}") from None

    def reset(self) -> None:
        self.send([RESET])


class RelayedCommands:
    """A rank's side: a DEALER to rank 0's relay."""

    def __init__(self, context: zmq.Context, endpoint: str, rank: int) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.IDENTITY, f"rank-{rank}".encode())
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.socket.connect(endpoint)

    def ready(self) -> None:
        self.socket.send(READY)

    def receive(self) -> list[bytes]:
        return self.socket.recv_multipart()
