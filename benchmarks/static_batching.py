"""The classic baseline: `transformers` `generate` over fixed batches (static batching).

    ztgi bench static --dataset mixed --batch-size 16 --model-id smollm2 --dtype float32

The prompts are taken in order, `--batch-size` at a time, left-padded (pad id = EOS) and decoded
greedily with `max_new_tokens` = the largest of the batch: a batch runs until its longest request
ends (or every row has hit EOS), and the next batch starts only then. Each request counts only its
useful tokens: up to its own `max_new_tokens` and its first EOS (the EOS included, as ztgi counts
it); what a row generates beyond that is padding work. Throughput is useful tokens / total time.

With `--ignore-eos`, `min_new_tokens` = the batch's `max_new_tokens` keeps EOS from being chosen,
so every batch runs its full length and every request counts exactly its `max_new_tokens`.

Per-request latencies are stamped at every generation step, as if each row streamed its tokens:
a request arrives when its batch starts, TTFT is the batch's prefill, E2E ends at its own last
useful token (a non-streaming server could only answer at `batch_times_s`, the batch's end).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import eos_token_ids, load_model, load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, results_json, write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import OfflineRequest, encode_prompts
from ztgi.common.config import require

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StaticBatchingConfig(BaselineConfig):
    """Static batching with `transformers` `generate`: the baseline ztgi's throughput is compared to."""

    batch_size: int = dataclasses.field(default=16, metadata={"help": "requests per generate call"})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}")


class StepClock(StoppingCriteria):
    """Stamps the end of every generation step; stops nothing."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs: Any) -> torch.Tensor:
        if input_ids.is_cuda:
            torch.cuda.synchronize(input_ids.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class StaticBatching:
    """Runs a workload through `model.generate` (a transformers causal LM, as `baseline_model.load_model`
    loads it), `batch_size` requests at a time."""

    def __init__(self, model: Any, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                 ignore_eos: bool = False) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.ignore_eos = ignore_eos
        self.eos_token_ids = eos_token_ids(model)

    def warmup(self, requests: Sequence[OfflineRequest]) -> None:
        """A two-token generate of the first batch, so no timed batch pays a one-off start-up cost."""
        self._generate(requests[:self.batch_size], max_new_tokens=2)

    def run(self, requests: Sequence[OfflineRequest]) -> BaselineRun:
        """Every request, batch after batch; duration from the first batch's start to the last's end."""
        records: list[RequestRecord] = []
        batch_times_s: list[float] = []
        run_start = time.perf_counter()
        for first in range(0, len(requests), self.batch_size):
            batch = requests[first:first + self.batch_size]
            batch_start = time.perf_counter()
            records += self._run_batch(batch, batch_start, run_start)
            batch_times_s.append(time.perf_counter() - batch_start)
        summary = summarize(records, time.perf_counter() - run_start)
        return BaselineRun("static", self.batch_size, records, summary, {"batch_times_s": batch_times_s})

    def _run_batch(self, batch: Sequence[OfflineRequest], batch_start: float, run_start: float) -> list[RequestRecord]:
        new_ids, step_times = self._generate(batch, max(r.max_new_tokens for r in batch))
        records = []
        for request, ids in zip(batch, new_ids):
            num_useful = useful_token_count(ids, request.max_new_tokens,
                                            () if self.ignore_eos else self.eos_token_ids)
            record = RequestRecord(request.request_id, request.max_new_tokens, len(request.input_ids),
                                   start_s=batch_start - run_start)
            record.set_timings(batch_start, step_times[:num_useful], step_times[num_useful - 1])
            records.append(record)
        return records

    def _generate(self, batch: Sequence[OfflineRequest], max_new_tokens: int) -> tuple[list[list[int]], list[float]]:
        """Greedy `generate` of a left-padded batch: each row's new ids and the time of every step."""
        inputs = self.tokenizer.pad({"input_ids": [r.input_ids for r in batch]}, return_tensors="pt")
        inputs = inputs.to(self.model.device)
        clock = StepClock()
        output = self.model.generate(**inputs, generation_config=self._generation_config(max_new_tokens),
                                     stopping_criteria=StoppingCriteriaList([clock]))
        return output[:, inputs["input_ids"].shape[1]:].tolist(), clock.times

    def _generation_config(self, max_new_tokens: int) -> GenerationConfig:
        """Greedy and nothing else (no penalty from the model's defaults), as ztgi decodes by default."""
        return GenerationConfig(
            do_sample=False, num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0,
            max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if self.ignore_eos else 0,
            eos_token_id=self.eos_token_ids, pad_token_id=self.tokenizer.pad_token_id)


def useful_token_count(new_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int]) -> int:
    """Tokens a request really asked for: up to its own `max_new_tokens` and its first EOS, included."""
    new_ids = new_ids[:max_new_tokens]
    for position, token_id in enumerate(new_ids):
        if token_id in eos_token_ids:
            return position + 1
    return len(new_ids)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the summary as JSON; exit 2 for a bad flag or dataset."""
    setup = parse_workload(StaticBatchingConfig, argv, "static")
    if setup is None:
        return 2
    config, prompts = setup
    tokenizer = load_tokenizer(config.model_id)
    requests = encode_prompts(tokenizer, prompts)
    baseline = StaticBatching(load_model(config.model_id, config.dtype, config.device), tokenizer,
                              config.batch_size, config.ignore_eos)
    baseline.warmup(requests)
    run = baseline.run(requests)
    sys.stdout.write(json.dumps(results_json(config, [run], with_requests=False), indent=1) + "\n")
    if config.output:
        write_results(config.output, results_json(config, [run]))
        logger.info("wrote %s", config.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
