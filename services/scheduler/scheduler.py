"""The scheduler's logic: every message in, the frames to send out. No sockets here.

`Scheduler` owns the request table, the queue, the tokenizer pool, the client registry and the
batcher (which owns the worker pool). The service (`service.py`, the process and its sockets)
feeds it frames per socket and flushes `scheduler.outbox` after each pass.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time

from ztgi.common.codec import MessageError, decode, encode
from ztgi.common.lora_adapter import AdapterError
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    AdapterReply,
    Adopt,
    Cancel,
    CommandDone,
    CommandFailed,
    Encoded,
    EncodeJob,
    ErrorReply,
    FilterResult,
    Forget,
    Generate,
    Generation,
    Heartbeat,
    Hello,
    InfoReply,
    LoadAdapter,
    Query,
    Rejected,
    RequestKey,
    StatsReply,
    StepResult,
    StreamEvent,
    StreamEvents,
    TextBatch,
    TokenizeDone,
    TokenizeQuery,
    TokenStep,
    UnloadAdapter,
    WarmupResult,
    WorkerInfo,
)
from ztgi.services.scheduler.adapter_registry import AdapterRefusal, AdapterRegistry, BaseLinears
from ztgi.services.scheduler.batcher import Batcher
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.health import Assessment, HealthMonitor, WorkerLoss, assess
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus
from ztgi.services.scheduler.request_table import RequestTable
from ztgi.services.scheduler.tokenize_router import TokenizeRouter
from ztgi.services.scheduler.tokenizer_pool import TokenizerPool
from ztgi.services.scheduler.worker_slot import WorkerSlot

logger = logging.getLogger(__name__)

VERSION = "0.1.0"
CLIENT_MESSAGES = (Generate, Cancel, Query, TokenizeQuery, Hello, Heartbeat, LoadAdapter, UnloadAdapter)
TOKENIZER_MESSAGES = (Hello, Heartbeat, TextBatch, TokenizeDone)
WORKER_MESSAGES = (Hello, Heartbeat, StepResult, FilterResult, WarmupResult, CommandDone, CommandFailed)


@dataclasses.dataclass
class Counters:
    num_generated_tokens: int = 0
    num_requests_finished: int = 0


class Scheduler:
    """Routes every message of the system and runs the batching loop through `Batcher`."""

    def __init__(self, config: SchedulerConfig, boot_nonce: str) -> None:
        self.config = config
        self.boot_nonce = boot_nonce
        self.outbox = Outbox()
        self.table = RequestTable()
        self.queue = RequestQueue()
        self.counters = Counters()
        self.draining = False
        self.tokenizers = TokenizerPool(self.outbox)
        self.clients: dict[bytes, float] = {}
        self.last_worker_loss: WorkerLoss | None = None
        self.last_tokenizer_loss_at = -math.inf
        self.started_at = time.monotonic()
        self.had_ready_worker = False  # whether any worker has finished its warmup since the start
        self.health_monitor = HealthMonitor(self.outbox, config.canary_timeout_s)
        self.batcher = Batcher(config, self.table, self.queue, self.outbox,
                               self._on_generations, self._fail_requests, self.health_monitor.on_canary)
        self.metrics = self.batcher.metrics
        self.tokenize_router = TokenizeRouter(self.outbox)
        self.adapters = AdapterRegistry(config.lora_adapters, config.max_lora_rank)

    # -- clients (frontend) --------------------------------------------------------------------

    def on_client_frame(self, client_id: bytes, frame: bytes) -> None:
        try:
            msg = decode(frame, CLIENT_MESSAGES)
        except MessageError as exc:
            logger.warning("bad frame from client %r: %s", client_id, exc)
            self.outbox.to_client(client_id, encode(ErrorReply(str(exc))))
            return
        if isinstance(msg, (Hello, Heartbeat)) or client_id in self.clients:
            self.clients[client_id] = time.monotonic()  # only clients that heartbeat are watched
        match msg:
            case Generate():
                self._admit(client_id, msg)
            case Cancel():
                self._cancel(RequestKey(client_id, msg.request_id))
            case TokenizeQuery():
                self.tokenize_router.submit(client_id, msg, self.tokenizers.identities())
            case Query(kind="health"):
                self._answer_health(client_id, msg.query_id)
            case Query():
                self.outbox.to_client(client_id, encode(self._answer_query(msg)))
            case LoadAdapter() | UnloadAdapter():
                self.outbox.to_client(client_id, encode(self._adapter_command(msg)))
            case Hello() | Heartbeat():
                self.outbox.to_client(client_id, encode(Heartbeat(self.boot_nonce)))

    def _admit(self, client_id: bytes, generate: Generate) -> None:
        key = RequestKey(client_id, generate.request_id)
        if self.table.by_key(key) is not None:
            self._send_error(key, f"request_id {generate.request_id!r} is already in use", "validation")
            return
        if self.draining:
            self._send_error(key, "The server is shutting down", "unhealthy")
            return
        if len(self.table) >= self.config.max_concurrent_requests:
            self._send_error(key, "Model is overloaded", "overloaded")
            return
        try:
            adapter = self.adapters.resolve(generate.parameters)
        except AdapterRefusal as refusal:
            self._send_error(key, refusal.message, refusal.error_type)
            return
        request = self.table.create(key)
        request.encode_job = encode(EncodeJob(key, generate, self.boot_nonce))
        request.parameters = generate.parameters
        request.adapter = adapter
        self._push_encode_job(request, time.monotonic())

    def _push_encode_job(self, request: Request, now: float) -> None:
        request.encode_pushed_at = now
        self.outbox.to_tokenizer_pool(request.encode_job)

    def _push_encode_jobs_again(self, now: float) -> None:
        """Pushes once more each encode job pushed within a heartbeat window of a tokenizer's loss
        and unanswered for a window since.

        The jobs pushed again when a loss is heard (`_lose_tokenizer`) can still be routed to the
        dead tokenizer's pipe, which the PUSH socket closes a moment later: such a request would
        wait for ever. Jobs pushed well after the last loss are not pushed again, however long a
        busy tokenizer takes: an overload is not doubled. A job answered twice is forgotten by the
        tokenizer of the copy (`on_tokenized_frame`)."""
        window = self.config.peer_timeout_s
        for request in self.table:
            if (request.status is RequestStatus.ENCODING and now - request.encode_pushed_at > window
                    and request.encode_pushed_at <= self.last_tokenizer_loss_at + window):
                logger.warning("request %s: encode job unanswered %.1f s after a tokenizer's loss, pushed again",
                               request.seq_id, now - request.encode_pushed_at)
                self._push_encode_job(request, now)

    def _cancel(self, key: RequestKey) -> None:
        request = self.table.by_key(key)
        if request is None:
            return
        logger.debug("request %s cancelled (%s)", request.seq_id, request.status.value)
        self._drop(request)
        if request.encoded is not None:
            self.outbox.to_tokenizer(request.tokenizer_id, Forget([key]))

    def _drop(self, request: Request) -> None:
        """Removes a request everywhere; a running one leaves its batch at the next Filter."""
        self.table.remove(request)
        self.batcher.release_blocks(request)
        if request.status is RequestStatus.QUEUED:
            self.queue.remove(request)

    def _send_error(self, key: RequestKey, error: str, error_type: str) -> None:
        self.metrics.record_failure(error_type)
        event = StreamEvent(request_id=key.request_id, error=error, error_type=error_type)
        self.outbox.to_client(key.client_id, encode(StreamEvents([event])))

    def _fail_requests(self, requests: list[Request], error: str, error_type: str) -> None:
        for request in requests:
            self._drop(request)
            self._send_error(request.key, error, error_type)
            if request.encoded is not None:
                self.outbox.to_tokenizer(request.tokenizer_id, Forget([request.key]))

    # -- tokenizers ----------------------------------------------------------------------------

    def on_tokenized_frame(self, frame: bytes) -> None:
        try:
            msg = decode(frame, (Encoded, Rejected))
        except MessageError as exc:
            logger.warning("bad frame on tokenized: %s", exc)
            return
        request = self.table.by_key(msg.key)
        if isinstance(msg, Rejected):
            if request is not None:
                self._drop(request)
                self._send_error(msg.key, msg.error, msg.error_type)
            return
        if request is None or request.status is not RequestStatus.ENCODING:
            # cancelled meanwhile, or a job re-pushed after a tokenizer loss and answered twice:
            # forget the copy, never the owner's state of a live request
            if request is None or msg.tokenizer_id != request.tokenizer_id:
                self.outbox.to_tokenizer(msg.tokenizer_id, Forget([msg.key]))
            return
        request.encoded = msg
        request.encode_job = b""
        shortfall = self.batcher.kv_cache_shortfall(request) or self._embedding_refusal(msg)
        if shortfall is not None:
            self._fail_requests([request], shortfall, "validation")
            return
        request.status = RequestStatus.QUEUED
        request.queued_at = time.monotonic()
        self.metrics.record_encoded(request, request.queued_at)
        self.queue.append(request)

    def _embedding_refusal(self, encoded: Encoded) -> str | None:
        """Why the workers cannot answer an embedding request (their engine returns no hidden
        states); None when they can, or when none has registered yet."""
        if not encoded.embed:
            return None
        for worker in self.batcher.workers.ready():
            if worker.info.pooling is None:
                return f"{worker.info.model_id} cannot be pooled into embeddings: {worker.info.pooling_error}"
        return None

    def on_tokenizer_frame(self, tokenizer_id: bytes, frame: bytes) -> None:
        try:
            msg = decode(frame, TOKENIZER_MESSAGES)
        except MessageError as exc:
            logger.warning("bad frame from tokenizer %r: %s", tokenizer_id, exc)
            return
        self.tokenizers.seen(tokenizer_id, time.monotonic(), hello=isinstance(msg, Hello))
        match msg:
            case Hello() | Heartbeat():
                self.outbox.to_tokenizer(tokenizer_id, Heartbeat(self.boot_nonce))
            case TextBatch():
                self._on_text_batch(tokenizer_id, msg)
            case TokenizeDone():
                self.tokenize_router.on_done(msg)

    def _on_text_batch(self, tokenizer_id: bytes, batch: TextBatch) -> None:
        steps = self.tokenizers.acknowledge(tokenizer_id, batch.job_id)
        if steps is None:
            # a job of before this tokenizer was lost (frozen): another tokenizer has its steps
            logger.warning("tokenizer %s answered detokenize job %d, which it no longer owns: dropped",
                           tokenizer_id.decode(errors="replace"), batch.job_id)
            return
        for request, _ in steps:
            request.num_acknowledged += 1
        for output in batch.outputs:
            self.outbox.to_client(output.client_id, output.payload)
        for key in batch.finished:
            stopped = self.table.by_key(key)
            if stopped is not None:
                self._drop(stopped)
                self.counters.num_requests_finished += 1
                self.metrics.record_finished(stopped, None, time.monotonic())

    # -- workers -------------------------------------------------------------------------------

    def on_worker_frame(self, worker_id: bytes, frame: bytes) -> None:
        try:
            msg = decode(frame, WORKER_MESSAGES)
        except MessageError as exc:
            logger.warning("bad frame from worker %r: %s", worker_id, exc)
            return
        now = time.monotonic()
        match msg:
            case Hello():
                if msg.protocol_version != PROTOCOL_VERSION:
                    logger.error("worker %r speaks protocol %d, not %d; ignored", worker_id,
                                 msg.protocol_version, PROTOCOL_VERSION)
                    return
                if msg.worker is not None and not self._adapters_fit(worker_id, msg.worker):
                    return
                self.batcher.register(worker_id, msg)
            case Heartbeat():  # from the worker's liveness socket, known by its boot nonce
                slot = self.batcher.workers.heard_from(worker_id, now, msg.boot_nonce)
                drained = slot is not None and msg.drain_s_left is not None and self.batcher.on_drain(
                    slot, now + msg.drain_s_left)
                # a worker dropped for silence (frozen, starved) hears it here and says Hello again
                self.outbox.to_worker(worker_id, Heartbeat(self.boot_nonce, slot is not None, drained=drained))
            case _:
                self.batcher.workers.heard_from(worker_id, now)
                self.batcher.on_answer(worker_id, msg)
                if not self.had_ready_worker and isinstance(msg, WarmupResult):
                    self.had_ready_worker = bool(self.batcher.workers.ready())

    def on_worker_disconnected(self, worker_id: bytes) -> None:
        """A worker's command connection closed (its process ended): it is lost now, not after
        the heartbeat window."""
        self._lose_worker(worker_id, "disconnected")

    def _lose_worker(self, worker_id: bytes, reason: str) -> None:
        if worker_id in self.batcher.workers:
            self.batcher.on_worker_lost(worker_id, reason)
            self.last_worker_loss = WorkerLoss(worker_id, reason, time.monotonic())

    def on_tokenizer_disconnected(self, tokenizer_id: bytes) -> None:
        if tokenizer_id in self.tokenizers:
            self._lose_tokenizer(tokenizer_id, "disconnected", time.monotonic())

    def _on_generations(self, slot: WorkerSlot, generations: list[Generation]) -> None:
        """Sends one DetokenizeJob per owning tokenizer for this step's tokens."""
        steps_by_tokenizer: dict[bytes, list[tuple[Request, TokenStep]]] = collections.defaultdict(list)
        for generation in generations:
            request = self.table.record(generation, slot.identity)
            if request is None:
                continue  # finished, stopped or cancelled while this step ran
            if request.num_resumed_tokens:
                generation = dataclasses.replace(
                    generation, generated_tokens=generation.generated_tokens + request.num_resumed_tokens)
            steps_by_tokenizer[request.tokenizer_id].append(
                (request, TokenStep(request.key, generation, request.num_cached_tokens)))
            if generation.finish_reason is not None:
                self.batcher.release_blocks(request)
                self.counters.num_requests_finished += 1
                self.metrics.record_finished(request, generation, time.monotonic())
        for tokenizer_id, steps in steps_by_tokenizer.items():
            self._send_detokenize(tokenizer_id, steps)

    def _send_detokenize(self, tokenizer_id: bytes, steps: list[tuple[Request, TokenStep]]) -> None:
        self.counters.num_generated_tokens += len(steps)
        self.tokenizers.send_detokenize(tokenizer_id, steps)

    # -- queries -------------------------------------------------------------------------------

    def _adapters_fit(self, worker_id: bytes, info: WorkerInfo) -> bool:
        """Whether the registered adapters fit a worker's base model. At start (no worker ready
        yet) an adapter of --lora-adapters that does not fit stops the scheduler; later, such a
        worker is ignored."""
        if not self.adapters.names():
            return True
        try:
            self.adapters.check_base(BaseLinears(info.lora_targets, info.num_layers))
        except AdapterError as exc:
            if not self.had_ready_worker:
                raise SystemExit(f"ztgi scheduler: {exc}") from None
            logger.error("worker %r serves %s, which the loaded adapters do not fit (%s): ignored", worker_id,
                         info.model_id, exc)
            return False
        return True

    def _adapter_command(self, command: LoadAdapter | UnloadAdapter) -> AdapterReply:
        """Registers or forgets an adapter (vLLM's /v1/load_lora_adapter and unload)."""
        try:
            if isinstance(command, LoadAdapter):
                self.adapters.load(command.name, command.path, self._base_linears())
            else:
                using = sum(1 for r in self.table if r.adapter is not None and r.adapter.name == command.name)
                self.adapters.unload(command.name, using)
        except AdapterRefusal as refusal:
            return AdapterReply(command.query_id, refusal.message, refusal.error_type)
        return AdapterReply(command.query_id)

    def _base_linears(self) -> BaseLinears | None:
        """The base model's adaptable linears, from a ready worker (None before one is)."""
        workers = self.batcher.workers.ready()
        if not workers:
            return None
        info = workers[0].info
        return BaseLinears(info.lora_targets, info.num_layers)

    def _answer_query(self, query: Query) -> object:
        match query.kind:
            case "info":
                return self._info(query.query_id)
            case _:
                return self._stats(query.query_id)

    def _answer_health(self, client_id: bytes, query_id: str) -> None:
        """Answers now, or after a one-token canary when no worker has made progress lately."""
        now = time.monotonic()
        canary_worker = self.health_monitor.query(client_id, query_id, self.assess_health(now), now)
        if canary_worker is not None:
            self.batcher.send_canary(canary_worker)

    def assess_health(self, now: float) -> Assessment:
        return assess(self.batcher.workers.values(), len(self.tokenizers), self.draining, now,
                      self.config.health_window_s, self.last_worker_loss)

    def _info(self, query_id: str) -> InfoReply:
        config = self.config
        workers = self.batcher.workers.ready()
        info = workers[0].info if workers else None
        return InfoReply(
            query_id=query_id,
            model_id=info.model_id if info else "",
            model_dtype=info.dtype if info else "",
            model_device_type=info.device if info else "",
            max_concurrent_requests=config.max_concurrent_requests,
            max_best_of=config.max_best_of,
            max_stop_sequences=config.max_stop_sequences,
            max_input_tokens=config.max_input_tokens,
            max_total_tokens=config.max_total_tokens,
            max_batch_total_tokens=min((w.max_batch_total_tokens for w in workers), default=0),
            max_batch_prefill_tokens=self._prefill_token_budget(workers),
            max_waiting_tokens=config.max_waiting_tokens,
            max_batch_size=config.max_batch_size,
            waiting_served_ratio=config.waiting_served_ratio,
            num_workers=len(workers),
            num_tokenizers=len(self.tokenizers),
            version=VERSION,
            kv_cache="paged" if workers and all(w.is_paged for w in workers) else "padded",
            block_size=max((w.allocator.block_size for w in workers if w.allocator), default=0),
            num_blocks=sum(w.allocator.num_blocks for w in workers if w.allocator),
            speculate=config.speculate,
            placement=config.placement,
            quantize=info.quantize if info else "none",
            draft_model_id=info.draft_model_id if info else None,
            pooling=info.pooling if info else None,
            pooling_error=info.pooling_error if info else None,
            hidden_size=info.hidden_size if info else 0,
            matryoshka=info.matryoshka if info else False,
            vision=info.vision if info else False,
            lora_adapters=self.adapters.names(),
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
        )

    def _prefill_token_budget(self, workers: list[WorkerSlot]) -> int:
        """The per-step token budget in force: the configured one, else the workers' measured one."""
        paged = [w.step_token_budget(self.config.max_batch_prefill_tokens) for w in workers if w.is_paged]
        return min(paged) if paged else self.config.padded_prefill_tokens

    def _stats(self, query_id: str) -> StatsReply:
        workers = self.batcher.workers.values()
        return StatsReply(
            query_id=query_id,
            num_queued=len(self.queue),
            num_running=sum(1 for r in self.table if r.status is RequestStatus.RUNNING),
            num_workers=len(self.batcher.workers.ready()),
            num_tokenizers=len(self.tokenizers),
            worker_batch_sizes={w.identity.decode(errors="replace"): w.batch_size for w in workers},
            worker_requests_served={w.identity.decode(errors="replace"): w.num_requests_served for w in workers},
            num_generated_tokens=self.counters.num_generated_tokens,
            num_requests_finished=self.counters.num_requests_finished,
            families=self.metrics.to_messages(workers),
        )

    # -- time ----------------------------------------------------------------------------------

    def schedule(self) -> None:
        self.batcher.schedule()

    def tick(self, now: float) -> None:
        """Liveness: drops silent peers, pushes lost encode jobs again and fails requests that cannot
        be served in time."""
        timeout = self.config.peer_timeout_s
        for worker in list(self.batcher.workers.values()):
            if now - worker.last_seen > timeout:
                self._lose_worker(worker.identity, "missed heartbeats")
        for tokenizer_id in self.tokenizers.silent_since(now - timeout):
            self._lose_tokenizer(tokenizer_id, "missed heartbeats", now)
        self._push_encode_jobs_again(now)
        for client_id, last_seen in list(self.clients.items()):
            if now - last_seen > timeout:
                del self.clients[client_id]
                for request in self.table.of_client(client_id):
                    self._cancel(request.key)
        if not self.batcher.workers.serving():
            self._fail_stale_queue(now)
        self.health_monitor.tick(now, self.batcher.workers)

    def _lose_tokenizer(self, tokenizer_id: bytes, reason: str, now: float) -> None:
        """Hands a lost tokenizer's requests to another one and re-sends what it never answered.

        Unanswered encode jobs are pushed again (one may have been queued for the lost
        tokenizer). Each request it owned is adopted by a live tokenizer, which replays the
        tokens the client already has; unacknowledged steps are then sent to the adopter.
        """
        unanswered = self.tokenizers.remove(tokenizer_id)
        self.last_tokenizer_loss_at = now
        self.tokenize_router.reroute(tokenizer_id, self.tokenizers.identities())
        encoding = [r for r in self.table if r.status is RequestStatus.ENCODING]
        for request in encoding:
            self._push_encode_job(request, now)
        owned = {r.seq_id: r for r in self.table if r.encoded is not None and r.tokenizer_id == tokenizer_id}
        # finished requests whose last tokens were never answered still need their final event
        owned.update((r.seq_id, r) for steps in unanswered for r, step in steps if step.generation.finish_reason)
        pending = [[(r, step) for r, step in steps if r.seq_id in owned] for steps in unanswered]
        logger.warning("tokenizer %s lost (%s): re-sending %d encode jobs, %d requests to adopt",
                       tokenizer_id.decode(errors="replace"), reason, len(encoding), len(owned))
        if owned and reason == "missed heartbeats":  # it may be frozen, and come back
            self.tokenizers.adopted_from(tokenizer_id, [r.key for r in owned.values()])
        if owned:
            self._adopt(list(owned.values()), pending)

    def _adopt(self, requests: list[Request], pending: list[list[tuple[Request, TokenStep]]]) -> None:
        if not self.tokenizers:
            self._fail_requests([r for r in requests if r.seq_id in self.table],
                                "The tokenizer serving this request was lost", "unhealthy")
            return
        adopter = self.tokenizers.least_busy()
        for request in requests:
            assert request.encoded is not None and request.parameters is not None
            request.encoded = dataclasses.replace(request.encoded, tokenizer_id=adopter)
            emitted_ids = request.generated_ids[:request.num_acknowledged]
            self.outbox.to_tokenizer(adopter, Adopt(request.encoded, request.parameters, emitted_ids))
        for steps in pending:
            self._send_detokenize(adopter, steps)
        self.counters.num_generated_tokens -= sum(len(steps) for steps in pending)  # counted once already

    def cancel_all(self, reason: str) -> None:
        """Ends every request with an explicit reason (the end of a drain)."""
        self._fail_requests(list(self.table), reason, "cancelled")

    def _workers_starting(self, now: float) -> bool:
        """A worker is registered and warming up, or none has been ready yet and the scheduler is
        younger than startup_grace_s (workers load their model before they register)."""
        if any(not slot.ready for slot in self.batcher.workers.values()):
            return True
        return not self.had_ready_worker and now - self.started_at < self.config.startup_grace_s

    def _fail_stale_queue(self, now: float) -> None:
        """With no ready worker, a queued request fails after no_worker_timeout_s, or, while workers
        are still starting, after startup_grace_s (whichever is longer)."""
        timeout = self.config.no_worker_timeout_s
        if self._workers_starting(now):
            timeout = max(timeout, self.config.startup_grace_s)
        stale = [r for r in self.queue if now - r.queued_at > timeout]
        if stale:
            self._fail_requests(stale, "No worker is available to serve the request", "unhealthy")
