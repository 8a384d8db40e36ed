"""One registered worker as the batching loop sees it."""

from __future__ import annotations

import collections
import dataclasses
import enum
import time

from ztgi.common.messages import CachedBatch, WorkerInfo
from ztgi.services.scheduler.block_allocator import BlockAllocator


class CommandKind(enum.Enum):
    WARMUP = "warmup"
    PREFILL = "prefill"
    DECODE = "decode"
    FILTER = "filter"
    CLEAR = "clear"
    CANARY = "canary"  # a one-token prefill asked for by a health query


@dataclasses.dataclass(slots=True)
class InFlight:
    """A command sent to a worker and not answered yet; `seq_ids` are the requests it concerns."""

    command_id: int
    kind: CommandKind
    seq_ids: list[int]
    batch_ids: list[int]
    sent_at: float = dataclasses.field(default_factory=time.monotonic)
    num_new: dict[int, int] = dataclasses.field(default_factory=dict)  # paged: KV tokens each request computes
    newcomers: list[int] = dataclasses.field(default_factory=list)  # paged Prefill: the requests it admits
    blocks_sent_before: dict[int, int] = dataclasses.field(default_factory=dict)  # paged: to undo if refused


@dataclasses.dataclass(slots=True)
class WorkerSlot:
    """A worker's registration, its cached batches and where it is in TGI's batching loop.

    `batches` are the cached batches the next Decode concatenates (usually one; two right after
    new requests were prefilled beside a running batch), as of the last answer. `in_flight` holds
    the commands sent and not answered, in order: one, or two when a Decode was pipelined behind
    a Decode. `admission_checked` says the queue was already looked at for this decode round, so
    a round admits at most one new batch.
    """

    identity: bytes
    info: WorkerInfo
    boot_nonce: str
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    last_progress: float = 0.0  # when the worker last answered a command (a heartbeat is not progress)
    max_batch_total_tokens: int = 0
    ready: bool = False
    batches: list[CachedBatch] = dataclasses.field(default_factory=list)
    in_flight: collections.deque[InFlight] = dataclasses.field(default_factory=collections.deque)
    waiting_tokens: int = 0
    admission_checked: bool = False
    num_requests_served: int = 0
    num_steps: int = 0
    allocator: BlockAllocator | None = None  # paged workers: their KV blocks, announced at warmup
    max_step_tokens: int = 0  # paged: the step size the worker measured at warmup
    kv_window: int | None = None  # paged: its model's sliding window, when every layer has one
    canary_block_ids: list[int] = dataclasses.field(default_factory=list)
    drain_deadline: float | None = None  # draining (it was told to stop): when its grace period ends
    step_s: float = 0.0  # a moving average of its steps' round trips: how soon a draining worker's requests end

    @property
    def is_paged(self) -> bool:
        return self.allocator is not None

    def step_token_budget(self, configured: int | None) -> int:
        """Tokens a paged step may carry: the operator's budget, else what the worker measured."""
        return configured or self.max_step_tokens

    @property
    def draining(self) -> bool:
        return self.drain_deadline is not None

    def record_step_time(self, seconds: float) -> None:
        self.step_s = seconds if not self.step_s else 0.8 * self.step_s + 0.2 * seconds

    @property
    def idle(self) -> bool:
        return self.ready and not self.in_flight

    @property
    def batch_size(self) -> int:
        return sum(batch.size for batch in self.batches)

    @property
    def batch_max_tokens(self) -> int:
        return sum(batch.max_tokens for batch in self.batches)

    def replace_batch(self, batch_id: int, batch: CachedBatch | None) -> None:
        """Puts a filtered batch in place of `batch_id`, or drops it when nothing is left."""
        index = next(i for i, b in enumerate(self.batches) if b.batch_id == batch_id)
        if batch is None:
            del self.batches[index]
        else:
            self.batches[index] = batch
