"""The scheduler's batching loop and the worker's engine in one process, with no sockets.

`LocalEngine` is the server's core with the messaging taken out: the scheduler's own `Batcher`,
`RequestQueue` and `RequestTable` decide every command exactly as the scheduler process does
(TGI's rule: prefill what fits, decode, admit newcomers beside a running batch, filter what
finished), and the worker's own `Engine` runs each one. The typed messages pass between them
directly: the batcher's outbox keeps each command as the message it built (the server encodes
it for the `workers` socket), the engine answers it, and the answer goes to
`Batcher.on_answer` as the scheduler would hand it over. Nothing is reimplemented here: this
file only wires those classes and keeps the generations of each step for its caller.

    engine = LocalEngine(load_model("smollm2"), SchedulerConfig())
    seq_id = engine.add(encoded)          # an `Encoded`, as a tokenizer makes it
    while engine.has_unfinished():
        for generation in engine.step():      # this step's tokens; finish_reason on the last
            ...
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ztgi.common.codec import encode
from ztgi.common.lora_adapter import AdapterError
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    AdapterRef,
    CommandFailed,
    Encoded,
    Generation,
    Hello,
)
from ztgi.services.scheduler.adapter_registry import AdapterRefusal, AdapterRegistry, BaseLinears
from ztgi.services.scheduler.batcher import Batcher
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.outbox import Outbox
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus
from ztgi.services.scheduler.request_table import RequestTable
from ztgi.services.scheduler.worker_slot import WorkerSlot
from ztgi.services.worker.backend import Model
from ztgi.services.worker.engine import Engine
from ztgi.services.worker.shards.command_relay import CommandRelay
from ztgi.services.worker.shards.shard_group import ShardGroupLost

logger = logging.getLogger(__name__)

WORKER_ID = b"local-worker"


class EngineError(RuntimeError):
    """The engine failed a command; `seq_ids` are the requests it took down."""

    def __init__(self, error: str, seq_ids: list[int]) -> None:
        super().__init__(error)
        self.seq_ids = seq_ids


@dataclasses.dataclass
class CommandOutbox(Outbox):
    """The batcher's outbox with the worker's commands kept as messages, for the engine in this
    process (the scheduler's outbox encodes them for a socket)."""

    commands: list[object] = dataclasses.field(default_factory=list)

    def to_worker(self, worker_id: bytes, message: object) -> None:
        self.commands.append(message)

    def take(self) -> list[object]:
        commands, self.commands = self.commands, []
        return commands


class LocalEngine:
    """One worker's engine under the scheduler's batching loop; `step` runs one command."""

    def __init__(self, model: Model, config: SchedulerConfig, memory_budget_mb: int = 4096,
                 cpu_warmup_prefill_tokens: int | None = 512, step_target_ms: int = 250,
                 relay: CommandRelay | None = None) -> None:
        self.config = config
        self.relay = relay  # rank 0 of a worker group: every command goes to the other ranks first
        self.engine = Engine(model, memory_budget_mb, cpu_warmup_prefill_tokens, step_target_ms)
        self.table = RequestTable()
        self.queue = RequestQueue()
        self.outbox = CommandOutbox()
        self.batcher = Batcher(config, self.table, self.queue, self.outbox, self._on_generations,
                               self._on_failure)
        self._generations: list[Generation] = []
        self._failure: EngineError | None = None
        self._hello = Hello(role="worker", protocol_version=PROTOCOL_VERSION, boot_nonce="local",
                            worker=model.info())
        info = model.info()
        self.base = BaseLinears(info.lora_targets, info.num_layers)
        self.adapters = AdapterRegistry(config.lora_adapters, config.max_lora_rank)
        try:
            self.adapters.check_base(self.base)
        except AdapterError as exc:
            raise ValueError(f"lora_adapters: {exc}") from None
        self.batcher.register(WORKER_ID, self._hello)  # sends the Warmup, as to a worker that says Hello
        try:
            self._run(self.outbox.take())
        except EngineError as exc:  # limits the model cannot serve, or no room for one request
            raise ValueError(f"the engine's warmup failed: {exc}") from None

    @property
    def slot(self) -> WorkerSlot:
        """The worker as the batcher sees it: its cached batches, steps, requests served."""
        return self.batcher.workers[WORKER_ID]

    @property
    def max_batch_total_tokens(self) -> int:
        return self.slot.max_batch_total_tokens

    # -- requests ------------------------------------------------------------------------------

    def adapter(self, name: str, path: str) -> AdapterRef:
        """The LoRA adapter `name` from `path`, registered (checked against the model) unless it is
        already; one registered under that name from another path is replaced. ValueError when it
        cannot be served."""
        known = self.adapters.ref(name)
        if known is not None and known.path == path:
            return known
        try:
            if known is not None:
                using = sum(1 for r in self.table if r.adapter is not None and r.adapter.name == name)
                self.adapters.unload(name, using)
            return self.adapters.load(name, path, self.base)
        except AdapterRefusal as refusal:
            raise ValueError(f"LoRA adapter {name!r}: {refusal.message}") from None

    def add(self, encoded: Encoded, adapter: AdapterRef | None = None) -> int:
        """Queues an encoded request, as the scheduler queues a tokenizer's answer, generating with
        `adapter` (None: the base model); its integer id."""
        request = self.table.create(encoded.key)
        request.encoded = encoded
        request.adapter = adapter
        request.status = RequestStatus.QUEUED
        request.queued_at = time.monotonic()
        self.queue.append(request)
        return request.seq_id

    def abort(self, seq_id: int) -> None:
        """Ends a request (a stop sequence was hit, or the caller gave up): it leaves the queue now,
        or its batch at the next Filter; tokens of it still to come are dropped."""
        request = self.table.get(seq_id)
        if request is None:
            return
        self.table.remove(request)
        self.batcher.release_blocks(request)  # a paged worker's blocks, as the scheduler frees them
        if request.status is RequestStatus.QUEUED:
            self.queue.remove(request)

    def reset(self) -> None:
        """Drops every request and cached batch (after a run was interrupted mid-command): the
        worker is lost and registered again, as the scheduler recovers one, warmup included."""
        for request in list(self.table):
            self.abort(request.seq_id)
        self.outbox.take()
        self.batcher.register(WORKER_ID, self._hello)  # a worker registered again is lost first
        self._run(self.outbox.take())

    def has_unfinished(self) -> bool:
        """Requests still live, or commands still due (a request aborted after its step was planned)."""
        return len(self.table) > 0 or bool(self.outbox.commands)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> list[Generation]:
        """Runs the worker's next command (the batcher picks one first when none is due): this
        step's tokens for live requests, or none (a Filter); EngineError when the command failed."""
        if not self.outbox.commands:
            self.batcher.schedule()
        commands = self.outbox.take()
        if not commands and len(self.table):
            raise EngineError("the queue's next request fits no batch: raise max_batch_prefill_tokens "
                              "or max_batch_total_tokens", [r.seq_id for r in self.queue])
        self._generations = []
        self._run(commands)
        while not len(self.table) and self.outbox.commands:
            self._run(self.outbox.take())  # the last Filter: no batch stays cached once all is done
        self.engine.release_freed_memory()  # the worker's housekeeping between commands
        return self._generations

    def _run(self, commands: list[object]) -> None:
        self._failure = None
        for command in commands:
            self.batcher.on_answer(WORKER_ID, self._execute(command))
        if self._failure is not None:
            raise self._failure

    def _execute(self, command: object) -> object:
        """One verb, one engine call, as the worker's engine loop runs it (relayed first in a group)."""
        try:
            if self.relay is not None:
                self.relay.send([encode(command)])
            answer = self.engine.run(command)
        except ShardGroupLost as exc:  # a rank of the group exited or hung: nothing more can run
            raise RuntimeError(f"the tensor-parallel group cannot go on: {exc}") from None
        if isinstance(answer, CommandFailed):
            self._failure = EngineError(answer.error, list(answer.seq_ids))
        return answer

    def _on_generations(self, slot: WorkerSlot, generations: list[Generation]) -> None:
        """The scheduler's bookkeeping of a step (`RequestTable.record`); the live tokens are kept."""
        for generation in generations:
            request = self.table.record(generation, slot.identity)
            if request is None:
                continue
            self._generations.append(generation)
            if generation.finish_reason is not None:
                self.batcher.release_blocks(request)

    def _on_failure(self, requests: list[Request], error: str, error_type: str) -> None:
        """Requests a failed command took down leave the table, as the scheduler fails them."""
        for request in requests:
            self.abort(request.seq_id)
        if self._failure is not None:
            self._failure.seq_ids = sorted({*self._failure.seq_ids, *(r.seq_id for r in requests)})
        logger.error("%d requests failed (%s): %s", len(requests), error_type, error)
