"""TGI's continuous batching loop, as one state machine per worker driven by its answers.

The rule: an idle worker with nothing cached takes the longest prefix of the queue that fits
`max_batch_prefill_tokens` and its `max_batch_total_tokens`, and prefills it. From then on it
decodes its cached batch step by step. Before each decode step it looks at the queue once: new
requests join when at least `waiting_served_ratio` x the running batch size are waiting, or
whatever is waiting once the queue has waited `max_waiting_tokens` steps; they are prefilled as a
new batch and the next Decode concatenates both. After every step, requests that finished,
stopped on a stop sequence or were cancelled leave their batch by a Filter before anything else
runs. Budgets count padding (the backend pads to the longest input). Each worker runs one
command at a time; several workers are data-parallel replicas that all pull from the one queue.

A paged worker (its warmup announced a block pool) is batched step by step instead
(`PagedBatcher`): every step carries its decodes, the next chunks of long prompts and newcomers,
within one token budget, on blocks this scheduler allocates; the Prefill of newcomers names the
cached batch, so both run in one forward, and the worker keeps one batch.

Pipelined decode (`--pipeline-decode`, off by default; padded workers, whose steps need no new
blocks from here): while a worker runs a Decode and nothing else is due (no request of the batch
has left, the queue is not to be admitted), the batch's next Decode is sent behind it, so the
worker starts the next step the moment it answers instead of waiting a round trip through the
scheduler. A request that finishes in a step then runs one
more step before its Filter (the worker leaves stopped requests out of its answers), and a
Decode of a batch that ended meanwhile gets an empty answer from the worker.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import time
from collections.abc import Callable

from ztgi.common.messages import (
    Batch,
    Clear,
    CommandDone,
    CommandFailed,
    Decode,
    Filter,
    FilterResult,
    Generation,
    Hello,
    Prefill,
    SamplingParameters,
    SeqUpdate,
    StepResult,
    Warmup,
    WarmupResult,
    WorkerRequest,
)
from ztgi.services.scheduler.block_allocator import BlockAllocator
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.metrics import SchedulerMetrics
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.paged_batcher import PagedBatcher, PagedStep
from ztgi.services.scheduler.placement import ROUND_ROBIN, Placement, PlacementPolicy, placement_outcome
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus
from ztgi.services.scheduler.request_table import RequestTable
from ztgi.services.scheduler.round_robin_placement import RoundRobinPlacement
from ztgi.services.scheduler.sliding_window import free_blocks_behind_window
from ztgi.services.scheduler.worker_pool import WorkerPool
from ztgi.services.scheduler.worker_slot import CommandKind, InFlight, WorkerSlot

logger = logging.getLogger(__name__)

GenerationsHandler = Callable[[WorkerSlot, list[Generation]], None]
FailureHandler = Callable[[list[Request], str, str], None]
CanaryHandler = Callable[[WorkerSlot, "str | None"], None]
CANARY_REQUEST_ID = 0  # the request table numbers real requests from 1


class Batcher:
    """The batching loop over the registered workers (`WorkerPool`); sends commands through the outbox."""

    def __init__(self, config: SchedulerConfig, table: RequestTable, queue: RequestQueue,
                 outbox: Outbox, on_generations: GenerationsHandler, on_failure: FailureHandler,
                 on_canary: CanaryHandler | None = None) -> None:
        self.config = config
        self.table = table
        self.queue = queue
        self.outbox = outbox
        self.on_generations = on_generations
        self.on_failure = on_failure
        self.on_canary = on_canary
        self.workers = WorkerPool()
        self.metrics = SchedulerMetrics()
        self.paged = PagedBatcher(config, queue)
        self._command_ids = itertools.count(1)
        self._batch_ids = itertools.count(1)

    # -- workers joining and leaving -----------------------------------------------------------

    def register(self, identity: bytes, hello: Hello) -> None:
        """A worker said Hello: (re)register it and warm it up."""
        if hello.worker is None:
            logger.warning("worker %r sent Hello without WorkerInfo; ignored", identity)
            return
        if identity in self.workers:
            self.on_worker_lost(identity, "worker registered again")
        slot = self.workers.add(identity, hello.worker, hello.boot_nonce)
        config = self.config
        self._send(slot, CommandKind.WARMUP, [], [], lambda command_id: Warmup(
            command_id, config.max_input_tokens, config.max_total_tokens,
            config.padded_prefill_tokens, config.max_batch_total_tokens))

    def on_worker_lost(self, identity: bytes, reason: str) -> None:
        """Forgets a worker; its requests go back to the front of the queue to resume elsewhere."""
        slot = self.workers.remove(identity)
        if slot is None:
            return
        resumed = [r for r in self.table if r.worker_id == identity and r.status is RequestStatus.RUNNING]
        logger.warning("worker %s lost (%s): %d requests go back to the queue",
                       identity.decode(errors="replace"), reason, len(resumed))
        now = time.monotonic()
        for request in sorted(resumed, key=lambda r: r.seq_id, reverse=True):
            request.requeue(now)
            self.queue.appendleft(request)

    def release_blocks(self, request: Request) -> None:
        """A request leaves its paged worker (finished, cancelled, failed): its blocks are free for
        the next step, which the Filter that removes it from the worker's batch precedes."""
        slot = self.workers.get(request.worker_id) if request.worker_id is not None else None
        if slot is not None and slot.allocator is not None and request.block_ids:
            slot.allocator.free(request.block_ids[request.num_dropped_blocks:])
        request.block_ids, request.num_dropped_blocks = [], 0

    def kv_cache_shortfall(self, request: Request) -> str | None:
        """Why the request can never run (it needs more KV than any paged worker's pool holds)."""
        workers = self.workers.ready()
        if not workers or not all(slot.is_paged for slot in workers):
            return None
        capacity = max(slot.allocator.capacity_tokens for slot in workers if slot.allocator is not None)
        if request.total_tokens <= capacity:
            return None
        return (f"the request needs {request.total_tokens} tokens of KV cache (inputs + max_new_tokens), more "
                f"than a worker's KV pool holds ({capacity} tokens): lower max_new_tokens or the input")

    # -- answers -------------------------------------------------------------------------------

    def on_answer(self, identity: bytes, answer: object) -> None:
        """Handles a worker's answer to its in-flight command, then moves that worker on."""
        awaited = self.workers.awaited_answer(identity, answer)
        if awaited is None:
            return
        slot, in_flight, answer = awaited
        if in_flight.kind is CommandKind.CANARY:
            self._on_canary(slot, answer)
            self.advance(slot)
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
        self.advance(slot)

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
            self.metrics.record_step(in_flight.kind.value, time.monotonic() - in_flight.sent_at, result.timings)
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
                self._index_full_blocks(slot.allocator, request, len(request.tokens))
                if slot.kv_window is not None:
                    free_blocks_behind_window(request, slot.allocator, slot.kv_window)
        if self.config.speculate:
            self.metrics.record_tokens_per_step(decoded)

    @staticmethod
    def _index_full_blocks(allocator: BlockAllocator, request: Request, num_known: int) -> None:
        """Blocks the step filled become cached, for the requests after this one (prefix caching);
        only blocks of tokens the scheduler knows already (`num_known`: a step's accepted run is
        recorded after this)."""
        num_computed = min(request.num_computed, num_known)
        num_full = num_computed // allocator.block_size
        if allocator.cache is not None and num_full > request.num_indexed_blocks:
            allocator.index(request.tokens, request.block_ids, num_computed)
            request.num_indexed_blocks = num_full

    def _on_canary(self, slot: WorkerSlot, answer: object) -> None:
        if slot.allocator is not None and slot.canary_block_ids:
            slot.allocator.free(slot.canary_block_ids)
            slot.canary_block_ids = []
        if isinstance(answer, StepResult) and answer.batch is not None:  # not expected with one new token
            batch_id = answer.batch.batch_id
            self._send(slot, CommandKind.CLEAR, [], [batch_id], lambda command_id: Clear(command_id, batch_id))
        error = answer.error if isinstance(answer, CommandFailed) else None
        if error is None and not isinstance(answer, StepResult):
            error = f"unexpected answer {type(answer).__name__}"
        if self.on_canary is not None:
            self.on_canary(slot, error)

    def send_canary(self, slot: WorkerSlot) -> None:
        """A one-token prefill (max_new_tokens 1, so nothing stays cached) on an idle, empty worker."""
        assert slot.idle and not slot.batches
        if slot.allocator is not None:  # borrows a block of the empty pool
            slot.canary_block_ids = slot.allocator.allocate(1) or []
        request = WorkerRequest(CANARY_REQUEST_ID, [0], SamplingParameters(), max_new_tokens=1, ignore_eos=True,
                                block_ids=list(slot.canary_block_ids))
        batch = Batch(next(self._batch_ids), [request], max_tokens=2)
        self._send(slot, CommandKind.CANARY, [], [batch.batch_id], lambda command_id: Prefill(command_id, batch))

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
            self._send(slot, CommandKind.CLEAR, [], [], lambda command_id: Clear(command_id, None))
        failed = [r for rid in sorted(failed_ids) if (r := self.table.get(rid)) is not None]
        self.on_failure(failed, f"Request failed during generation: {failure.error}", "generation")

    # -- the loop ------------------------------------------------------------------------------

    def schedule(self) -> None:
        """Moves every idle worker on; empty workers first, each taking a fair share of the queue."""
        empty = [slot for slot in self.workers.ready() if slot.idle and not slot.batches]
        share = -(-len(self.queue) // len(empty)) if len(empty) > 1 else None
        for slot in empty:
            self.advance(slot, share)
        for slot in sorted(self.workers.ready(), key=lambda s: s.batch_size):
            self.advance(slot)

    def advance(self, slot: WorkerSlot, share: int | None = None) -> None:
        """Sends the idle worker its next command: Filter, Prefill or Decode, or nothing; a busy
        worker may get its next Decode pipelined."""
        if not slot.idle:
            self._pipeline_decode(slot)
            return
        if self._filter_finished(slot):
            return
        if slot.is_paged:
            self._advance_paged(slot)
            return
        if not slot.batches:
            max_size = self.config.max_batch_size
            if share is not None:
                max_size = share if max_size is None else min(max_size, share)
            self._prefill_next(slot, None, max_size, slot.max_batch_total_tokens)
            return
        if not slot.admission_checked:
            slot.admission_checked = True
            if not self._other_worker_is_empty(slot) and self._admit_into_running(slot):
                return
        self._decode(slot)

    def _other_worker_is_empty(self, slot: WorkerSlot) -> bool:
        """Data parallelism: newcomers go to an idle, empty replica rather than join a running batch."""
        return any(other is not slot and other.idle and not other.batches for other in self.workers.ready())

    def _filter_finished(self, slot: WorkerSlot) -> bool:
        for batch in slot.batches:
            keep_ids = [rid for rid in batch.seq_ids if self._runs_on(rid, slot)]
            if len(keep_ids) != len(batch.seq_ids):
                self._send(slot, CommandKind.FILTER, keep_ids, [batch.batch_id],
                           functools.partial(Filter, batch_id=batch.batch_id, seq_ids=keep_ids))
                return True
        return False

    def _runs_on(self, seq_id: int, slot: WorkerSlot) -> bool:
        request = self.table.get(seq_id)
        return request is not None and request.status is RequestStatus.RUNNING and request.worker_id == slot.identity

    # -- paged workers -------------------------------------------------------------------------

    def _advance_paged(self, slot: WorkerSlot) -> None:
        assert slot.allocator is not None, "a paged worker"
        listed = (self.table.get(rid) for batch in slot.batches for rid in batch.seq_ids)
        running = [r for r in listed if r is not None]
        placement = self._placement(slot)
        may_admit = placement is not None or not (running and self._other_worker_is_empty(slot))
        budget = slot.step_token_budget(self.config.max_batch_prefill_tokens)
        step = self.paged.plan(running, slot.allocator, budget, may_admit, placement)
        if step.admitted:
            self.metrics.record_prefix_hits(step.admitted)
            if placement is not None and self.config.prefix_caching:
                self.metrics.record_placements(placement_outcome(r, slot, placement) for r in step.admitted)
        if step.victims:
            self._preempt(slot, step.victims)
        elif not step.is_empty:
            self._send_paged_step(slot, step)

    def _placement(self, slot: WorkerSlot) -> PlacementPolicy | None:
        """With several paged workers: `--placement round-robin`, or cache-aware when prefix
        caching is on (off: each worker admits from the queue's head when it has room)."""
        slots = [s for s in self.workers.ready() if s.is_paged]
        round_robin = self.config.placement == ROUND_ROBIN
        if len(slots) < 2 or not self.queue or not (round_robin or self.config.prefix_caching):
            return None
        running: dict[bytes, list[Request]] = {}
        for request in self.table:
            if request.status is RequestStatus.RUNNING and request.worker_id is not None:
                running.setdefault(request.worker_id, []).append(request)
        if round_robin:
            return RoundRobinPlacement(slot, slots, running, self.config.max_batch_size)
        return Placement(slot, slots, running)

    def _preempt(self, slot: WorkerSlot, victims: list[Request]) -> None:
        """Frees the victims' blocks and queues them first; the Filter takes them off the worker."""
        now = time.monotonic()
        for request in victims:
            logger.info("worker %s is out of KV blocks: request %d preempted after %d tokens",
                        slot.identity.decode(errors="replace"), request.seq_id, len(request.generated_ids))
            self.release_blocks(request)
            request.requeue(now)
            self.queue.appendleft(request)
            self.metrics.preemptions.inc()
        self._filter_finished(slot)

    def _send_paged_step(self, slot: WorkerSlot, step: PagedStep) -> None:
        """One Decode, or a Prefill of the newcomers joined with the cached batch."""
        blocks_sent_before = {r.seq_id: r.num_blocks_sent for r in step.running}
        updates = []
        for request in step.running:
            blocks, chunk = request.new_blocks(), step.chunks.get(request.seq_id)
            if blocks or chunk is not None:
                updates.append(SeqUpdate(request.seq_id, blocks, chunk))
        self.metrics.record_chunks(step)
        batch_ids = [batch.batch_id for batch in slot.batches]
        seq_ids = [r.seq_id for r in step.running + step.admitted]
        if not step.admitted:
            self._send(slot, CommandKind.DECODE, seq_ids, batch_ids,
                       lambda command_id: Decode(command_id, batch_ids, updates), step.num_new)
            return
        now = time.monotonic()
        for request in step.admitted:
            request.status = RequestStatus.RUNNING
            request.worker_id = slot.identity
            request.prefill_started_at = now
        self.metrics.record_prefill(step.admitted, now)
        slot.num_requests_served += len(step.admitted)
        batch = Batch(next(self._batch_ids), [r.to_worker(step.chunks[r.seq_id]) for r in step.admitted],
                      sum(r.total_tokens for r in step.admitted))
        self._send(slot, CommandKind.PREFILL, seq_ids, [*batch_ids, batch.batch_id],
                   lambda command_id: Prefill(command_id, batch, batch_ids, updates), step.num_new)
        slot.in_flight[-1].newcomers = [r.seq_id for r in step.admitted]
        slot.in_flight[-1].blocks_sent_before = blocks_sent_before

    def _admit_into_running(self, slot: WorkerSlot) -> bool:
        min_size, max_size = self._admission_sizes(slot)
        if max_size is not None and max_size <= 0:
            return False
        token_budget = slot.max_batch_total_tokens - slot.batch_max_tokens
        return self._prefill_next(slot, min_size, max_size, token_budget)

    def _admission_sizes(self, slot: WorkerSlot) -> tuple[int | None, int | None]:
        """TGI's rule for newcomers joining a running batch: at least `min_size` of them (None:
        any number, the queue has waited `max_waiting_tokens` steps), at most `max_size`."""
        config = self.config
        batch_size = slot.batch_size
        min_size = None if slot.waiting_tokens >= config.max_waiting_tokens else int(
            batch_size * config.waiting_served_ratio)
        max_size = None if config.max_batch_size is None else config.max_batch_size - batch_size
        return min_size, max_size

    def _admission_due(self, slot: WorkerSlot) -> bool:
        """Whether the queue would be looked at for this worker's running batch now."""
        if not self.queue or self._other_worker_is_empty(slot):
            return False
        min_size, max_size = self._admission_sizes(slot)
        return (max_size is None or max_size > 0) and len(self.queue) >= (min_size or 1)

    def _pipeline_decode(self, slot: WorkerSlot) -> None:
        """Behind a lone Decode in flight, the batch's next Decode, unless a Filter (a request of
        the batch has left) or an admission is due first: those wait for the worker's answer."""
        if not self.config.pipeline_decode or not slot.ready or slot.is_paged or len(slot.in_flight) != 1:
            return
        running = slot.in_flight[0]
        if running.kind is not CommandKind.DECODE or self._admission_due(slot):
            return
        if any(seq_id not in self.table for seq_id in running.seq_ids):
            return
        batch_ids = running.batch_ids[:1]  # the Decode in flight concatenates into its first batch
        slot.waiting_tokens += 1
        self._send(slot, CommandKind.DECODE, running.seq_ids, batch_ids,
                   lambda command_id: Decode(command_id, batch_ids))

    def _prefill_next(self, slot: WorkerSlot, min_size: int | None, max_size: int | None,
                      token_budget: int) -> bool:
        taken = self.queue.next_batch(min_size, max_size, self.config.padded_prefill_tokens, token_budget)
        if taken is None:
            return False
        requests, max_tokens = taken
        now = time.monotonic()
        for request in requests:
            request.status = RequestStatus.RUNNING
            request.worker_id = slot.identity
            request.prefill_started_at = now
        self.metrics.record_prefill(requests, now)
        batch = Batch(next(self._batch_ids), [r.to_worker() for r in requests], max_tokens)
        self._send(slot, CommandKind.PREFILL, [r.seq_id for r in requests], [batch.batch_id],
                   lambda command_id: Prefill(command_id, batch))
        return True

    def _decode(self, slot: WorkerSlot) -> None:
        batch_ids = [batch.batch_id for batch in slot.batches]
        seq_ids = [rid for batch in slot.batches for rid in batch.seq_ids]
        slot.admission_checked = False
        slot.waiting_tokens += 1
        self._send(slot, CommandKind.DECODE, seq_ids, batch_ids,
                   lambda command_id: Decode(command_id, batch_ids))
        self._pipeline_decode(slot)

    def _send(self, slot: WorkerSlot, kind: CommandKind, seq_ids: list[int], batch_ids: list[int],
              build: Callable[[int], object], num_new: dict[int, int] | None = None) -> None:
        command_id = next(self._command_ids)
        slot.in_flight.append(InFlight(command_id, kind, seq_ids, batch_ids, num_new=num_new or {}))
        self.outbox.to_worker(slot.identity, build(command_id))
