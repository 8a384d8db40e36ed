"""The worker engine alone: no HTTP, no ZMQ, no tokenizer, driven as the scheduler drives it.

    python -m ztgi.bench.engine_alone --dataset mixed --concurrency 16 --model-id smollm2 --dtype float32

The ceiling ztgi's pipeline is measured against. `--concurrency` clients run a closed loop: each
sends its next request the moment its previous one finishes. The requests go through the
scheduler's own queue (`RequestQueue`, TGI's padded-batch budgets) and its batching rule: an
empty engine prefills what the queue gives; a running batch first drops its finished requests
(filter), then admits newcomers once at least `waiting_served_ratio` x its size are waiting or
the queue has waited `max_waiting_tokens` steps (they are prefilled as a new batch and
concatenated at the next step), then decodes one step. A request arrives when it enters the
queue; TTFT runs from there to the step that produced its first token. `--concurrency 1` gives
the engine's low-load TTFT: its prefill and nothing else.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import sys
import time
from collections.abc import Sequence

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, results_json, write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import OfflineRequest, encode_prompts
from ztgi.common.config import require
from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.messages import Encoded, Generation, RequestKey, SamplingParameters
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request, RequestStatus
from ztgi.services.worker.backend import load_padded_model
from ztgi.services.worker.batch import CausalLMBatch
from ztgi.services.worker.model import PaddedModel as Model

logger = logging.getLogger(__name__)

UNBOUNDED_TOKENS = 2**62


@dataclasses.dataclass(frozen=True)
class EngineAloneConfig(BaselineConfig):
    """The worker engine in-process under a closed loop of `--concurrency` clients."""

    concurrency: int = dataclasses.field(default=16, metadata={"help": "requests in flight"})
    max_batch_prefill_tokens: int = 4096
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.concurrency >= 1, f"--concurrency must be >= 1, got {self.concurrency}")
        require(self.max_batch_prefill_tokens >= 1, "--max-batch-prefill-tokens must be >= 1")
        require(self.max_batch_size is None or self.max_batch_size >= 1, "--max-batch-size must be >= 1")
        require(self.waiting_served_ratio >= 0, "--waiting-served-ratio must be >= 0")
        require(self.max_waiting_tokens >= 1, "--max-waiting-tokens must be >= 1")


@dataclasses.dataclass(frozen=True)
class BatchingPolicy:
    """The scheduler's batching limits, with its defaults (TGI's)."""

    max_batch_prefill_tokens: int = 4096
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20

    @classmethod
    def of(cls, config: EngineAloneConfig) -> BatchingPolicy:
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})


class EngineAlone:
    """Runs workloads through one `Model` at a fixed number of requests in flight."""

    def __init__(self, model: Model, policy: BatchingPolicy | None = None, ignore_eos: bool = False) -> None:
        self.model = model
        self.policy = policy or BatchingPolicy()
        self.ignore_eos = ignore_eos

    def warmup(self, requests: Sequence[OfflineRequest]) -> None:
        """A prefill and a decode step of all `requests` together, so no timed run pays a one-off cost."""
        short = [dataclasses.replace(request, max_new_tokens=2) for request in requests]
        _ClosedLoop(self.model, self.policy, self.ignore_eos, short, concurrency=len(short)).run()

    def run(self, requests: Sequence[OfflineRequest], concurrency: int) -> BaselineRun:
        """Every request once, at most `concurrency` in flight; duration from the start to the last answer."""
        loop = _ClosedLoop(self.model, self.policy, self.ignore_eos, requests, concurrency)
        records, duration_s = loop.run()
        return BaselineRun("engine", concurrency, records, summarize(records, duration_s),
                           {"num_prefills": loop.num_prefills, "num_decodes": loop.num_decodes})


class _ClosedLoop:
    """One run's state: the clients' requests, the queue, the cached batches, the clock."""

    def __init__(self, model: Model, policy: BatchingPolicy, ignore_eos: bool,
                 requests: Sequence[OfflineRequest], concurrency: int) -> None:
        self.model = model
        self.policy = policy
        self.ignore_eos = ignore_eos
        self.pending = collections.deque(requests)
        self.concurrency = concurrency
        self.queue = RequestQueue()
        self.batches: list[CausalLMBatch] = []
        self.records: dict[int, RequestRecord] = {}
        self.arrivals: dict[int, float] = {}
        self.token_times: dict[int, list[float]] = collections.defaultdict(list)
        self.finished_ids: set[int] = set()
        self.waiting_tokens = 0
        self.admission_checked = False
        self.batch_ids = itertools.count()
        self.num_prefills = self.num_decodes = 0
        self.start = self.end = 0.0

    def run(self) -> tuple[list[RequestRecord], float]:
        """The scheduler's loop for one worker: filter, prefill or admit, decode."""
        self.start = self.end = time.perf_counter()
        for _ in range(self.concurrency):
            self._arrive(self.start)
        while len(self.queue) or self.batches:
            self._filter_finished()
            if not self.batches:
                if not self._prefill(None, self.policy.max_batch_size, self._token_budget()):
                    raise RuntimeError("the queue's next request fits no batch: raise --max-batch-prefill-tokens")
            elif not self.admission_checked:
                self.admission_checked = True
                self._admit()
            else:
                self._decode()
        return [self.records[rid] for rid in sorted(self.records)], self.end - self.start

    def _arrive(self, now: float) -> None:
        """The next client request enters the queue, as the scheduler queues an encoded request."""
        if not self.pending:
            return
        request = self.pending.popleft()
        encoded = Encoded(key=RequestKey(b"engine-alone", str(request.request_id)), input_ids=request.input_ids,
                          sampling=SamplingParameters(), max_new_tokens=request.max_new_tokens,
                          ignore_eos=self.ignore_eos, top_n_tokens=0, prefill_logprobs=False, tokenizer_id=b"")
        self.queue.append(Request(request.request_id, encoded.key, RequestStatus.QUEUED, encoded, queued_at=now))
        self.arrivals[request.request_id] = now
        self.records[request.request_id] = RequestRecord(request.request_id, request.max_new_tokens,
                                                         len(request.input_ids), start_s=now - self.start)

    def _token_budget(self) -> int:
        total = self.policy.max_batch_total_tokens or UNBOUNDED_TOKENS
        return total - sum(batch.max_tokens for batch in self.batches)

    def _admit(self) -> bool:
        """Newcomers join when enough wait, or whatever waits once the queue waited long enough."""
        size = sum(len(batch) for batch in self.batches)
        min_size = None if self.waiting_tokens >= self.policy.max_waiting_tokens else int(
            size * self.policy.waiting_served_ratio)
        max_size = None if self.policy.max_batch_size is None else self.policy.max_batch_size - size
        if max_size is not None and max_size <= 0:
            return False
        return self._prefill(min_size, max_size, self._token_budget())

    def _prefill(self, min_size: int | None, max_size: int | None, token_budget: int) -> bool:
        taken = self.queue.next_batch(min_size, max_size, self.policy.max_batch_prefill_tokens, token_budget)
        if taken is None:
            return False
        requests, max_tokens = taken
        batch = CausalLMBatch.from_requests([r.to_worker() for r in requests], next(self.batch_ids),
                                            max_tokens, self.model)
        generations, next_batch, _ = self.model.generate_token(batch)
        self.num_prefills += 1
        self.waiting_tokens = 1
        if next_batch is not None:
            self.batches.append(next_batch)
        self._collect(generations, time.perf_counter())
        return True

    def _decode(self) -> None:
        batch = CausalLMBatch.concatenate(self.batches)
        generations, next_batch, _ = self.model.generate_token(batch)
        self.num_decodes += 1
        self.batches = [] if next_batch is None else [next_batch]
        self.admission_checked = False
        self.waiting_tokens += 1
        self._collect(generations, time.perf_counter())

    def _collect(self, generations: list[Generation], now: float) -> None:
        """Stamps every token; a finished request completes its record and its client sends the next."""
        for generation in generations:
            request_id = generation.seq_id
            self.token_times[request_id].append(now)
            if generation.finish_reason is not None:
                self.finished_ids.add(request_id)
                self.records[request_id].set_timings(self.arrivals[request_id], self.token_times.pop(request_id), now)
                self.end = now
                self._arrive(now)

    def _filter_finished(self) -> None:
        """Drops finished requests from their batches, as the scheduler's Filter does."""
        kept = []
        for batch in self.batches:
            keep_ids = [rid for rid in batch.seq_ids if rid not in self.finished_ids]
            filtered = batch.filter(keep_ids) if len(keep_ids) != len(batch) else batch
            if filtered is not None:
                kept.append(filtered)
        self.batches = kept


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the summary as JSON; exit 2 for a bad flag or dataset."""
    setup = parse_workload(EngineAloneConfig, argv, "engine_alone")
    if setup is None:
        return 2
    config, prompts = setup
    requests = encode_prompts(load_tokenizer(config.model_id), prompts)
    engine = EngineAlone(load_padded_model(config.model_id, config.dtype, config.device, config.backend,
                                           quantize=config.quantize), BatchingPolicy.of(config),
                         config.ignore_eos)
    engine.warmup(requests[:config.concurrency])
    freeze_startup_objects()  # as the worker does after its warmup: the model stays out of later collections
    run = engine.run(requests, config.concurrency)
    sys.stdout.write(json.dumps(results_json(config, [run], with_requests=False), indent=1) + "\n")
    if config.output:
        write_results(config.output, results_json(config, [run]))
        logger.info("wrote %s", config.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
