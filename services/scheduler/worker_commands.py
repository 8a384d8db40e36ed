"""Every command the batcher sends a worker, built, numbered and recorded as in flight."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ztgi.common.messages import Batch, CachedBatch, Clear, Decode, Filter, Prefill, SeqUpdate, Warmup, WorkerRequest
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.paged_batcher import PagedStep
from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.worker_slot import CommandKind, InFlight, WorkerSlot


class WorkerCommands:
    """Builds Warmup, Prefill, Decode, Filter and Clear; each gets the next command id and an
    `InFlight` on its worker's slot (the answer is matched to it), then goes to the outbox.
    New batches are numbered here too."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._command_ids = itertools.count(1)
        self._batch_ids = itertools.count(1)

    def warmup(self, slot: WorkerSlot, config: SchedulerConfig) -> None:
        self._send(slot, CommandKind.WARMUP, [], [], lambda command_id: Warmup(
            command_id, config.max_input_tokens, config.max_total_tokens,
            config.padded_prefill_tokens, config.max_batch_total_tokens))

    def prefill(self, slot: WorkerSlot, requests: list[Request], max_tokens: int) -> None:
        """A new batch of `requests` (a padded worker: the batch is cached beside any running one)."""
        batch = Batch(next(self._batch_ids), [r.to_worker() for r in requests], max_tokens)
        self._send(slot, CommandKind.PREFILL, [r.seq_id for r in requests], [batch.batch_id],
                   lambda command_id: Prefill(command_id, batch))

    def decode(self, slot: WorkerSlot, seq_ids: list[int], batch_ids: list[int]) -> None:
        self._send(slot, CommandKind.DECODE, seq_ids, batch_ids, lambda command_id: Decode(command_id, batch_ids))

    def filter(self, slot: WorkerSlot, batch: CachedBatch, keep_ids: list[int]) -> None:
        self._send(slot, CommandKind.FILTER, keep_ids, [batch.batch_id],
                   lambda command_id: Filter(command_id, batch.batch_id, keep_ids))

    def clear(self, slot: WorkerSlot, batch_id: int | None) -> None:
        """Drops one cached batch, or all of them (None)."""
        batch_ids = [] if batch_id is None else [batch_id]
        self._send(slot, CommandKind.CLEAR, [], batch_ids, lambda command_id: Clear(command_id, batch_id))

    def canary(self, slot: WorkerSlot, request: WorkerRequest) -> None:
        batch = Batch(next(self._batch_ids), [request], max_tokens=2)
        self._send(slot, CommandKind.CANARY, [], [batch.batch_id], lambda command_id: Prefill(command_id, batch))

    def paged_step(self, slot: WorkerSlot, step: PagedStep) -> None:
        """One step of a paged worker: a Decode of its cached batch, or a Prefill of the
        newcomers that names the cached batch so both run in one forward. Either carries the
        running requests' new blocks and prompt chunks."""
        blocks_sent_before = {r.seq_id: r.num_blocks_sent for r in step.running}
        updates = _seq_updates(step)
        batch_ids = [batch.batch_id for batch in slot.batches]
        seq_ids = [r.seq_id for r in step.running + step.admitted]
        if not step.admitted:
            self._send(slot, CommandKind.DECODE, seq_ids, batch_ids,
                       lambda command_id: Decode(command_id, batch_ids, updates), step.num_new)
            return
        batch = Batch(next(self._batch_ids), [r.to_worker(step.chunks[r.seq_id]) for r in step.admitted],
                      sum(r.total_tokens for r in step.admitted))
        self._send(slot, CommandKind.PREFILL, seq_ids, [*batch_ids, batch.batch_id],
                   lambda command_id: Prefill(command_id, batch, batch_ids, updates), step.num_new)
        slot.in_flight[-1].newcomers = [r.seq_id for r in step.admitted]
        slot.in_flight[-1].blocks_sent_before = blocks_sent_before

    def _send(self, slot: WorkerSlot, kind: CommandKind, seq_ids: list[int], batch_ids: list[int],
              build: Callable[[int], object], num_new: dict[int, int] | None = None) -> None:
        command_id = next(self._command_ids)
        slot.in_flight.append(InFlight(command_id, kind, seq_ids, batch_ids, num_new=num_new or {}))
        self.outbox.to_worker(slot.identity, build(command_id))


def _seq_updates(step: PagedStep) -> list[SeqUpdate]:
    """The running requests' blocks the worker has not been told about, and their next chunks."""
    updates = []
    for request in step.running:
        blocks, chunk = request.new_blocks(), step.chunks.get(request.seq_id)
        if blocks or chunk is not None:
            updates.append(SeqUpdate(request.seq_id, blocks, chunk))
    return updates
