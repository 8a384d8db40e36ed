"""What a worker's answer changes: its slot (cached batches, readiness) and its requests' state."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from ztgi.common.messages import CommandDone, CommandFailed, FilterResult, Generation, StepResult, WarmupResult
from ztgi.services.scheduler.block_allocator import BlockAllocator
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.metrics import SchedulerMetrics
from ztgi.services.scheduler.request import Request
from ztgi.services.scheduler.request_table import RequestTable
from ztgi.services.scheduler.sliding_window import free_blocks_behind_window
from ztgi.services.scheduler.worker_commands import WorkerCommands
from ztgi.services.scheduler.worker_pool import WorkerPool
from ztgi.services.scheduler.worker_slot import CommandKind, InFlight, WorkerSlot

logger = logging.getLogger(__name__)

GenerationsHandler = Callable[[WorkerSlot, list[Generation]], None]
FailureHandler = Callable[[list[Request], str, str], None]
CanaryHandler = Callable[[WorkerSlot, "str | None"], None]


class WorkerAnswers:
    """Applies each answer to the command it answers: a warmup makes the worker ready, a step
    hands its generations on and advances its requests' KV, a failure fails the requests it
    concerns. Deciding what the worker does next is the batcher's."""

    def __init__(self, config: SchedulerConfig, table: RequestTable, workers: WorkerPool,
                 metrics: SchedulerMetrics, commands: WorkerCommands, on_generations: GenerationsHandler,
                 on_failure: FailureHandler, on_canary: CanaryHandler | None) -> None:
        self.config = config
        self.table = table
        self.workers = workers
        self.metrics = metrics
        self.commands = commands
        self.on_generations = on_generations
        self.on_failure = on_failure
        self.on_canary = on_canary

    def apply(self, slot: WorkerSlot, in_flight: InFlight, answer: object) -> None:
        if in_flight.kind is CommandKind.CANARY:
            self._on_canary(slot, answer)
            return
        match answer:
            case WarmupResult():
                self._on_warmup(slot, answer)
            case StepResult():
                self._on_step(slot, in_flight, answer)
            case FilterResult():
                slot.replace_batch(in_flight.batch_ids[0], answer.batch)
                self.metrics.record_filter(time.monotonic() - in_flight.sent_at)
            case CommandDone():
                pass
            case CommandFailed():
                self._on_failed(slot, in_flight, answer)

    def _on_warmup(self, slot: WorkerSlot, result: WarmupResult) -> None:
        slot.max_batch_total_tokens = result.max_batch_total_tokens
        if result.num_blocks > 0:
            # a prefix's blocks behind a sliding window are freed while the request runs: nothing to share
            prefix_caching = self.config.prefix_caching and result.kv_window is None
            slot.allocator = BlockAllocator(result.num_blocks, result.block_size, prefix_caching)
            slot.max_step_tokens, slot.kv_window = result.max_step_tokens, result.kv_window
        slot.ready = True
        logger.info("worker %s ready: max_batch_total_tokens=%d", slot.identity.decode(errors="replace"),
                    result.max_batch_total_tokens)

    def _on_step(self, slot: WorkerSlot, in_flight: InFlight, result: StepResult) -> None:
        if result.generations or result.batch is not None:  # else a pipelined Decode of a batch that ended: no step ran
            slot.num_steps += 1
            step_s = time.monotonic() - in_flight.sent_at
            slot.record_step_time(step_s)
            self.metrics.record_step(in_flight.kind.value, step_s, result.timings)
        if slot.is_paged:
            self._on_paged_step(slot, in_flight, result)
        elif in_flight.kind is CommandKind.PREFILL:
            slot.num_requests_served += len(in_flight.seq_ids)
            slot.waiting_tokens = 1
            if result.batch is not None:
                slot.batches.append(result.batch)
        else:
            slot.batches = [result.batch] if result.batch is not None else []
        self.on_generations(slot, result.generations)

    def _on_paged_step(self, slot: WorkerSlot, in_flight: InFlight, result: StepResult) -> None:
        """The worker keeps one batch; each request of the step has computed its tokens' KV: its
        chunk, or for a decoding request its last token and the proposed tokens it accepted (one
        fewer than the tokens it got)."""
        assert slot.allocator is not None, "a paged worker"
        slot.batches = [result.batch] if result.batch is not None else []
        num_tokens = collections.Counter(generation.seq_id for generation in result.generations)
        decoded = []
        for seq_id, num_new in in_flight.num_new.items():
            request = self.table.get(seq_id)
            if request is not None and request.worker_id == slot.identity:
                if not request.is_prefilling:
                    num_new = max(num_tokens[seq_id], 1)
                    decoded.append(num_new)
                request.num_computed += num_new
                _index_full_blocks(slot.allocator, request, len(request.tokens))
                if slot.kv_window is not None:
                    free_blocks_behind_window(request, slot.allocator, slot.kv_window)
        if self.config.speculate:
            self.metrics.record_tokens_per_step(decoded)

    def _on_canary(self, slot: WorkerSlot, answer: object) -> None:
        if slot.allocator is not None and slot.canary_block_ids:
            slot.allocator.free(slot.canary_block_ids)
            slot.canary_block_ids = []
        if isinstance(answer, StepResult) and answer.batch is not None:  # not expected with one new token
            self.commands.clear(slot, answer.batch.batch_id)
        error = answer.error if isinstance(answer, CommandFailed) else None
        if error is None and not isinstance(answer, StepResult):
            error = f"unexpected answer {type(answer).__name__}"
        if self.on_canary is not None:
            self.on_canary(slot, error)

    def _on_failed(self, slot: WorkerSlot, in_flight: InFlight, failure: CommandFailed) -> None:
        logger.error("worker %s failed %s: %s", slot.identity.decode(errors="replace"),
                     in_flight.kind.value, failure.error)
        if in_flight.kind is CommandKind.WARMUP:
            self.workers.remove(slot.identity)
            return
        self.metrics.record_failed_step(in_flight.kind.value)
        failed_ids = set(in_flight.seq_ids)
        if self._only_newcomers_refused(slot, in_flight, failure):
            failed_ids = set(in_flight.newcomers)
        elif in_flight.kind is not CommandKind.PREFILL or slot.is_paged:  # its batches may be unusable
            failed_ids.update(rid for batch in slot.batches for rid in batch.seq_ids)
            slot.batches = []
            # tracked like any command: nothing else is sent to the worker before it is done
            self.commands.clear(slot, None)
        failed = [r for rid in sorted(failed_ids) if (r := self.table.get(rid)) is not None]
        self.on_failure(failed, f"Request failed during generation: {failure.error}", "generation")

    def _only_newcomers_refused(self, slot: WorkerSlot, in_flight: InFlight, failure: CommandFailed) -> bool:
        """A paged Prefill whose newcomers the worker refused (bad input) before it touched its
        cached batch: only they fail. The running requests' block updates were not applied: they
        are sent again with the next step."""
        if not (slot.is_paged and in_flight.kind is CommandKind.PREFILL and failure.seq_ids):
            return False
        if not set(failure.seq_ids) <= set(in_flight.newcomers):
            return False
        for seq_id, num_sent in in_flight.blocks_sent_before.items():
            if (request := self.table.get(seq_id)) is not None:
                request.num_blocks_sent = num_sent
        return True


def _index_full_blocks(allocator: BlockAllocator, request: Request, num_known: int) -> None:
    """Blocks the step filled become cached, for the requests after this one (prefix caching);
    only blocks of tokens the scheduler knows already (`num_known`: a step's accepted run is
    recorded after this)."""
    num_computed = min(request.num_computed, num_known)
    num_full = num_computed // allocator.block_size
    if allocator.cache is not None and num_full > request.num_indexed_blocks:
        allocator.index(request.cache_tokens, request.block_ids, num_computed, request.cache_salt)
        request.num_indexed_blocks = num_full
