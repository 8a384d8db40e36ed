"""The worker engine alone: no HTTP, no ZMQ, no tokenizer service, under the scheduler's batching.

    ztgi bench engine --dataset mixed --concurrency 16 --model-id smollm2 --dtype float32

The ceiling ztgi's pipeline is measured against, run through the public in-process API:
`ztgi.LLM` is the worker's own engine (padded KV cache, as this baseline always ran) under the
scheduler's own `Batcher` and `RequestQueue`, in this process. `LLM(max_num_seqs=N)` bounds the
requests in flight at N, and every request is given to one `generate` call as token ids.

What it measures, against the closed loop of N clients this tool ran before (which drove the
worker's model and the scheduler's queue by hand):
- The batching is the same. The closed loop's queue held only the requests whose clients had
  sent them, at most the free slots; here the queue holds every request and the batcher's
  `max_batch_size` (= N) admits at most the free slots, first in first out. Either way an empty
  engine prefills what fits, a running batch drops what finished, admits newcomers once
  `waiting_served_ratio` x its size wait or the queue waited `max_waiting_tokens` steps, then
  decodes: the same requests join the same steps.
- TTFT means the same. A closed-loop client sent its next request when one of its requests
  finished, so request i >= N arrived at the (i - N + 1)-th finish. Each request's arrival is
  that moment here too (the finishes come from `RequestOutput.metrics`), and its TTFT runs from
  there to the step that produced its first token; `--concurrency 1` gives the engine's low-load
  TTFT, its prefill and nothing else.
- It costs a little more per token: each step now also passes through the worker's `Engine`
  command objects and the offline detokenizer (text is decoded incrementally, as a server's
  tokenizer does), which the hand-driven loop skipped. The ceiling is the engine as ztgi runs
  it, not the bare model.
- The batch's token budget is the one the worker's warmup measured (as ztgi's scheduler gets it)
  unless `--max-batch-total-tokens` sets one; the hand-driven loop had none.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, results_json, write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import OfflineRequest, encode_prompts
from ztgi.common.config import require

logger = logging.getLogger(__name__)

KV_CACHE = "padded"


@dataclasses.dataclass(frozen=True)
class EngineAloneConfig(BaselineConfig):
    """The worker engine in-process with `--concurrency` requests in flight."""

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

    def engine_options(self, concurrency: int) -> dict[str, Any]:
        """`LLM`'s options for `concurrency` requests in flight (fewer when `max_batch_size` says so)."""
        options: dict[str, Any] = {
            "max_batch_prefill_tokens": self.max_batch_prefill_tokens,
            "max_num_seqs": concurrency if self.max_batch_size is None else min(concurrency, self.max_batch_size),
            "waiting_served_ratio": self.waiting_served_ratio, "max_waiting_tokens": self.max_waiting_tokens}
        if self.max_batch_total_tokens is not None:
            options["max_batch_total_tokens"] = self.max_batch_total_tokens
        return options


@dataclasses.dataclass(frozen=True)
class EngineModel:
    """The model the engine loads, as `LLM` takes it."""

    model_id: str
    dtype: str = "float32"
    device: str = "auto"
    backend: str = "auto"
    quantize: str = "none"

    @classmethod
    def of(cls, config: BaselineConfig) -> EngineModel:
        return cls(config.model_id, config.dtype, config.device, config.backend, config.quantize)


class EngineAlone:
    """Runs workloads through the engine in process at a fixed number of requests in flight; one
    `LLM` per level, loaded on first use and kept (`max_num_seqs` is fixed when it is built)."""

    def __init__(self, model: EngineModel, policy: BatchingPolicy | None = None, ignore_eos: bool = False) -> None:
        self.model = model
        self.policy = policy or BatchingPolicy()
        self.ignore_eos = ignore_eos
        self._engines: dict[int, Any] = {}

    def warmup(self, requests: Sequence[OfflineRequest], concurrencies: Sequence[int] | None = None) -> None:
        """At each level (default: all of `requests` in flight) a prefill and a decode step of that
        many requests together, so no timed run pays a one-off cost."""
        short = [dataclasses.replace(request, max_new_tokens=2) for request in requests]
        for concurrency in concurrencies or [len(short)]:
            self.run(short[:concurrency], concurrency)

    def run(self, requests: Sequence[OfflineRequest], concurrency: int) -> BaselineRun:
        """Every request once, at most `concurrency` in flight; duration from the start to the last answer."""
        from ztgi import SamplingParams

        params = [SamplingParams(temperature=0, max_tokens=request.max_new_tokens, ignore_eos=self.ignore_eos)
                  for request in requests]
        started = time.monotonic()
        outputs = self._engine(concurrency).generate([{"prompt_token_ids": r.input_ids} for r in requests], params,
                                                     use_tqdm=False)
        records = _records(requests, [output.metrics for output in outputs], concurrency, started)
        duration_s = max(output.metrics.finished_time for output in outputs) - started if outputs else 0.0
        return BaselineRun("engine", concurrency, records, summarize(records, duration_s))

    def _engine(self, concurrency: int) -> Any:
        if concurrency not in self._engines:
            from ztgi import LLM

            # no prefix cache: the warmup and every repeat send the same prompts, computed each time
            self._engines[concurrency] = LLM(self.model.model_id, dtype=self.model.dtype, device=self.model.device,
                                             backend=self.model.backend, kv_cache=KV_CACHE,
                                             quantize=self.model.quantize, prefix_caching=False,
                                             **self.policy.engine_options(concurrency))
        return self._engines[concurrency]


def _records(requests: Sequence[OfflineRequest], metrics: Sequence[Any], concurrency: int,
             started: float) -> list[RequestRecord]:
    """One record per request, each arriving when a closed loop of `concurrency` clients would have
    sent it: the first ones at the start, request i at the (i - concurrency + 1)-th finish."""
    finishes = sorted(m.finished_time for m in metrics)
    records = []
    for index, (request, timing) in enumerate(zip(requests, metrics)):
        arrival = started if index < concurrency else finishes[index - concurrency]
        record = RequestRecord(request.request_id, request.max_new_tokens, len(request.input_ids),
                               start_s=arrival - started)
        record.set_timings(arrival, timing.token_times, timing.finished_time)
        records.append(record)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the summary as JSON; exit 2 for a bad flag or dataset."""
    setup = parse_workload(EngineAloneConfig, argv, "engine")
    if setup is None:
        return 2
    config, prompts = setup
    requests = encode_prompts(load_tokenizer(config.model_id), prompts)
    engine = EngineAlone(EngineModel.of(config), BatchingPolicy.of(config), config.ignore_eos)
    engine.warmup(requests[:config.concurrency])
    run = engine.run(requests, config.concurrency)
    sys.stdout.write(json.dumps(results_json(config, [run], with_requests=False), indent=1) + "\n")
    if config.output:
        write_results(config.output, results_json(config, [run]))
        logger.info("wrote %s", config.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
