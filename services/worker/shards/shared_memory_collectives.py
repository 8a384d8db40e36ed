"""All-reduce and all-gather among the ranks of one host through a shared-memory buffer.

gloo moves every tensor through loopback TCP with a thread handshake per call: a sharded decode
step makes two collectives a layer of a few KiB each, and their latency, not their bytes, decides
(BENCHMARKS.md, "Tensor-parallel worker groups"). vLLM and SGLang use a shared-memory all-reduce
on CPU for the same reason. Here each rank writes its tensor into its own slot of a mapped file,
then publishes the call's sequence number in its flag; once every flag has reached it, each rank
reads all the slots and sums them in rank order, so every rank computes the same bytes. Slots are
double-buffered by the sequence number's parity: a rank can only reach call n + 2 after every rank
has published n + 1, which each does after reading call n's slots, so no slot is overwritten
while read. Publishing after the data relies on stores reaching memory in program order (x86's
TSO), which holds for ordinary stores: a slot of 1 MiB keeps each copy below the sizes at which
memcpy switches to non-temporal (weakly ordered) stores. Elsewhere, and for tensors larger than a
slot, the group uses gloo.
"""

from __future__ import annotations

import mmap
import os
import platform
import threading
import time

import numpy as np
import torch

SLOT_BYTES = 1 << 20  # larger tensors (prefill chunks' sums, many rows' logits) go through gloo
FLAG_BYTES = 64  # one cache line per rank's flag
SPINS_BEFORE_YIELDING = 1_000  # about a millisecond: a peer on a core of its own arrives sooner


def available() -> bool:
    """Where stores are seen in program order by other cores (the publication protocol's premise)."""
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir("/dev/shm")


class SharedMemoryCollectives:
    """The buffer of one group: rank 0 creates the file before the others open it (a barrier between)."""

    def __init__(self, path: str, rank: int, size: int, timeout_s: float, create: bool,
                 lost: threading.Event | None = None) -> None:
        self.rank, self.size, self.timeout_s, self.lost = rank, size, timeout_s, lost
        total = size * FLAG_BYTES + 2 * size * SLOT_BYTES
        if create:
            with open(path, "wb") as file:
                file.truncate(total)
        with open(path, "r+b") as file:
            self.buffer = mmap.mmap(file.fileno(), total)
        flags = np.frombuffer(self.buffer, dtype=np.int64, count=size * FLAG_BYTES // 8)
        self.flags = flags[::FLAG_BYTES // 8]  # each rank's flag on its own cache line
        self.slots = torch.frombuffer(self.buffer, dtype=torch.uint8, offset=size * FLAG_BYTES,
                                      count=2 * size * SLOT_BYTES).view(2, size, SLOT_BYTES)
        self.sequence = 0

    def fits(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and tensor.numel() * tensor.element_size() <= SLOT_BYTES

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in rank order, into `tensor`."""
        parts = self._exchange(tensor)
        torch.add(parts[0], parts[1], out=tensor)
        for part in parts[2:]:
            tensor.add_(part)
        return tensor

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(tensor), dim=-1)

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor, viewed in place in its slot, once all have written."""
        self.sequence += 1
        slots = self.slots[self.sequence % 2]
        nbytes = tensor.numel() * tensor.element_size()
        views = [slots[r, :nbytes].view(tensor.dtype).view(tensor.shape) for r in range(self.size)]
        views[self.rank].copy_(tensor)
        self.flags[self.rank] = self.sequence
        self._wait_for(self.sequence)
        return views

    def _wait_for(self, sequence: int) -> None:
        flags, spins, deadline = self.flags, 0, None
        while flags.min() < sequence:
            spins += 1
            if spins > SPINS_BEFORE_YIELDING:
                os.sched_yield()  # more ranks than free cores: let the peer run
                if self.lost is not None and self.lost.is_set():
                    raise TimeoutError(f"rank {self.rank}: a rank of the group exited")
                if deadline is None:
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: a peer did not reach collective {sequence} in "
                                       f"{self.timeout_s:g} s")

