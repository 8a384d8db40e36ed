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

A draining worker (told to stop; its heartbeats carry the grace left) admits nothing more; its
running requests finish there, except those that could not finish in time: while another worker
serves, they go back to the queue at once to resume there (`services/worker/drain.py`).
"""

from __future__ import annotations

import logging
import time

from ztgi.common.messages import Hello, SamplingParameters, WorkerRequest
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.metrics import SchedulerMetrics
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.paged_batcher import PagedBatcher, PagedStep
from ztgi.services.scheduler.placement import ROUND_ROBIN, Placement, PlacementPolicy, placement_outcome
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus
from ztgi.services.scheduler.request_table import RequestTable
from ztgi.services.scheduler.round_robin_placement import RoundRobinPlacement
from ztgi.services.scheduler.worker_answers import CanaryHandler, FailureHandler, GenerationsHandler, WorkerAnswers
from ztgi.services.scheduler.worker_commands import WorkerCommands
from ztgi.services.scheduler.worker_pool import WorkerPool
from ztgi.services.scheduler.worker_slot import CommandKind, WorkerSlot

logger = logging.getLogger(__name__)

CANARY_REQUEST_ID = 0  # the request table numbers real requests from 1
HAND_BACK_MARGIN_S = 1.0  # a draining worker's requests must end this long before its grace period does


class Batcher:
    """The batching loop over the registered workers (`WorkerPool`): decides each worker's next
    command (`WorkerCommands` builds and sends it) and hands answers to `WorkerAnswers`."""

    def __init__(self, config: SchedulerConfig, table: RequestTable, queue: RequestQueue,
                 outbox: Outbox, on_generations: GenerationsHandler, on_failure: FailureHandler,
                 on_canary: CanaryHandler | None = None) -> None:
        self.config = config
        self.table = table
        self.queue = queue
        self.workers = WorkerPool()
        self.metrics = SchedulerMetrics()
        self.paged = PagedBatcher(config, queue)
        self.commands = WorkerCommands(outbox)
        self.answers = WorkerAnswers(config, table, self.workers, self.metrics, self.commands,
                                     on_generations, on_failure, on_canary)

    # -- workers joining and leaving -----------------------------------------------------------

    def register(self, identity: bytes, hello: Hello) -> None:
        """A worker said Hello: (re)register it and warm it up."""
        if hello.worker is None:
            logger.warning("worker %r sent Hello without WorkerInfo; ignored", identity)
            return
        if identity in self.workers:
            self.on_worker_lost(identity, "worker registered again")
        slot = self.workers.add(identity, hello.worker, hello.boot_nonce)
        self.commands.warmup(slot, self.config)

    def on_worker_lost(self, identity: bytes, reason: str) -> None:
        """Forgets a worker; its requests go back to the front of the queue to resume elsewhere."""
        slot = self.workers.remove(identity)
        if slot is None:
            return
        resumed = self._running_on(slot)
        logger.log(logging.WARNING if resumed or not slot.draining else logging.INFO,
                   "worker %s %s (%s): %d requests go back to the queue", identity.decode(errors="replace"),
                   "left" if slot.draining else "lost", reason, len(resumed))
        self._requeue_first(resumed)
        if resumed:
            self.metrics.requests_requeued.inc(len(resumed), reason="worker_lost")

    def on_drain(self, slot: WorkerSlot, deadline: float) -> bool:
        """The worker drains until `deadline`: it gets no new requests; whether it is drained (no
        request runs on it and no command is on its way: it may exit)."""
        running = self._running_on(slot)
        if not slot.draining:
            logger.info("worker %s drains: %d running requests finish there within %.0f s, new ones go elsewhere",
                        slot.identity.decode(errors="replace"), len(running), deadline - time.monotonic())
        slot.drain_deadline = deadline
        return not running and not slot.in_flight

    def _running_on(self, slot: WorkerSlot) -> list[Request]:
        return [r for r in self.table if r.worker_id == slot.identity and r.status is RequestStatus.RUNNING]

    def _requeue_first(self, requests: list[Request]) -> None:
        """Running requests (blocks freed) go back to the front of the queue, in arrival order, to
        resume from their prompt and tokens so far."""
        now = time.monotonic()
        for request in sorted(requests, key=lambda r: r.seq_id, reverse=True):
            request.requeue(now)
            self.queue.appendleft(request)

    def _hand_back_late(self, slot: WorkerSlot) -> None:
        """A draining worker's requests that would not finish before its grace period ends (each
        remaining token a step of its recent length) go back to the queue now, while another
        worker can take them; the others finish where their KV is."""
        assert slot.drain_deadline is not None
        if not any(other is not slot for other in self.workers.serving()):
            return
        time_left = slot.drain_deadline - time.monotonic() - HAND_BACK_MARGIN_S
        late = [r for r in self._running_on(slot) if (r.remaining_new_tokens + 1) * slot.step_s > time_left]
        if not late:
            return
        logger.info("worker %s drains: %d requests could not finish in its %.1f s left, handed back to resume "
                    "on another worker", slot.identity.decode(errors="replace"), len(late), max(0.0, time_left))
        for request in late:
            self.release_blocks(request)
        self._requeue_first(late)
        self.metrics.requests_requeued.inc(len(late), reason="handed_back")

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

    def send_canary(self, slot: WorkerSlot) -> None:
        """A one-token prefill (max_new_tokens 1, so nothing stays cached) on an idle, empty worker."""
        assert slot.idle and not slot.batches
        if slot.allocator is not None:  # borrows a block of the empty pool
            slot.canary_block_ids = slot.allocator.allocate(1) or []
        request = WorkerRequest(CANARY_REQUEST_ID, [0], SamplingParameters(), max_new_tokens=1, ignore_eos=True,
                                block_ids=list(slot.canary_block_ids))
        self.commands.canary(slot, request)

    # -- answers -------------------------------------------------------------------------------

    def on_answer(self, identity: bytes, answer: object) -> None:
        """Handles a worker's answer to its in-flight command, then moves that worker on."""
        awaited = self.workers.awaited_answer(identity, answer)
        if awaited is None:
            return
        slot, in_flight, answer = awaited
        self.answers.apply(slot, in_flight, answer)
        self.advance(slot)

    # -- the loop ------------------------------------------------------------------------------

    def schedule(self) -> None:
        """Moves every idle worker on; empty workers first, each taking a fair share of the queue."""
        empty = [slot for slot in self.workers.serving() if slot.idle and not slot.batches]
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
        if slot.draining:
            self._hand_back_late(slot)
        if self._filter_finished(slot):
            return
        if slot.is_paged:
            self._advance_paged(slot)
            return
        if not slot.batches:
            if not slot.draining:
                self._prefill_empty(slot, share)
            return
        if not slot.admission_checked and not slot.draining:
            slot.admission_checked = True
            if not self._other_worker_is_empty(slot) and self._admit_into_running(slot):
                return
        self._decode(slot)

    def _other_worker_is_empty(self, slot: WorkerSlot) -> bool:
        """Data parallelism: newcomers go to an idle, empty replica rather than join a running batch."""
        return any(other is not slot and other.idle and not other.batches for other in self.workers.serving())

    def _filter_finished(self, slot: WorkerSlot) -> bool:
        for batch in slot.batches:
            keep_ids = [rid for rid in batch.seq_ids if self._runs_on(rid, slot)]
            if len(keep_ids) != len(batch.seq_ids):
                self.commands.filter(slot, batch, keep_ids)
                return True
        return False

    def _runs_on(self, seq_id: int, slot: WorkerSlot) -> bool:
        request = self.table.get(seq_id)
        return request is not None and request.status is RequestStatus.RUNNING and request.worker_id == slot.identity

    def _start_running(self, slot: WorkerSlot, requests: list[Request]) -> None:
        """Requests leave the queue for `slot`'s next Prefill."""
        now = time.monotonic()
        for request in requests:
            request.status = RequestStatus.RUNNING
            request.worker_id = slot.identity
            request.prefill_started_at = now
        self.metrics.record_prefill(requests, now)

    # -- paged workers -------------------------------------------------------------------------

    def _advance_paged(self, slot: WorkerSlot) -> None:
        assert slot.allocator is not None, "a paged worker"
        listed = (self.table.get(rid) for batch in slot.batches for rid in batch.seq_ids)
        running = [r for r in listed if r is not None]
        placement = None if slot.draining else self._placement(slot)
        may_admit = not slot.draining and (placement is not None or not (running and self._other_worker_is_empty(slot)))
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
        slots = [s for s in self.workers.serving() if s.is_paged]
        round_robin = self.config.placement == ROUND_ROBIN
        if len(slots) < 2 or not self.queue or not (round_robin or self.config.prefix_caching):
            return None
        running: dict[bytes, list[Request]] = {}
        for request in self.table:
            if request.status is RequestStatus.RUNNING and request.worker_id is not None:
                running.setdefault(request.worker_id, []).append(request)
        if round_robin:
            return RoundRobinPlacement(slot, slots, running, self.config.max_batch_size)
        return Placement(slot, slots, running, self.config.max_loras)

    def _preempt(self, slot: WorkerSlot, victims: list[Request]) -> None:
        """Frees the victims' blocks and queues them first; the Filter takes them off the worker."""
        for request in victims:
            logger.info("worker %s is out of KV blocks: request %d preempted after %d tokens",
                        slot.identity.decode(errors="replace"), request.seq_id, len(request.generated_ids))
            self.release_blocks(request)
            self.metrics.preemptions.inc()
        self._requeue_first(victims)
        self._filter_finished(slot)

    def _send_paged_step(self, slot: WorkerSlot, step: PagedStep) -> None:
        """One Decode, or a Prefill of the newcomers joined with the cached batch."""
        self.metrics.record_chunks(step)
        if step.admitted:
            self._start_running(slot, step.admitted)
            slot.num_requests_served += len(step.admitted)
        self.commands.paged_step(slot, step)

    # -- padded workers ------------------------------------------------------------------------

    def _prefill_empty(self, slot: WorkerSlot, share: int | None) -> None:
        """An empty worker takes the longest prefix of the queue that fits (at most `share`)."""
        max_size = self.config.max_batch_size
        if share is not None:
            max_size = share if max_size is None else min(max_size, share)
        self._prefill_next(slot, None, max_size, slot.max_batch_total_tokens)

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
        slot.waiting_tokens += 1
        # the Decode in flight concatenates into its first batch
        self.commands.decode(slot, running.seq_ids, running.batch_ids[:1])

    def _prefill_next(self, slot: WorkerSlot, min_size: int | None, max_size: int | None,
                      token_budget: int) -> bool:
        taken = self.queue.next_batch(min_size, max_size, self.config.padded_prefill_tokens, token_budget)
        if taken is None:
            return False
        requests, max_tokens = taken
        self._start_running(slot, requests)
        self.commands.prefill(slot, requests, max_tokens)
        return True

    def _decode(self, slot: WorkerSlot) -> None:
        batch_ids = [batch.batch_id for batch in slot.batches]
        seq_ids = [rid for batch in slot.batches for rid in batch.seq_ids]
        slot.admission_checked = False
        slot.waiting_tokens += 1
        self.commands.decode(slot, seq_ids, batch_ids)
        self._pipeline_decode(slot)
