"""Where one decode step's time goes, at a few batch sizes: forward, choice, host transfer, Python, message.

    python -m studies.step_profile --dtype float32 --batch-sizes 1,16,32 --num-threads 1

Each batch holds the first prompts of the mixed set (cycled), prefilled together and decoded
`--warmup-steps` steps, then `--steps` timed steps split as `Model.generate_token` runs them:
the model forward (with the KV cache writes), the next-token choice (processors, argmax, log-softmax),
the one host transfer of the step's rows, the per-request Python (stopping, Generation objects),
the batch bookkeeping for the next step, and the msgpack encoding of the StepResult the worker sends.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Sequence

import torch

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_tokenizer
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.config import parse_sweep
from ztgi.bench.offline_workload import encode_prompts
from ztgi.common.codec import encode
from ztgi.common.config import require
from ztgi.common.messages import SamplingParameters, StepResult, Timings, WorkerRequest
from ztgi.services.worker.model_loader import load_padded_model
from ztgi.services.worker.padded.batch import CausalLMBatch
from ztgi.services.worker.padded.model import PaddedModel
from ztgi.services.worker.sampling.generations import step_rows

logger = logging.getLogger(__name__)

PHASES = ("forward", "choose", "transfer", "python", "advance", "message")


@dataclasses.dataclass(frozen=True)
class StepProfileConfig(BaselineConfig):
    """Decode steps of the engine at fixed batch sizes, timed phase by phase."""

    batch_sizes: str = "1,16,32"
    steps: int = 20
    warmup_steps: int = 3
    num_threads: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_sweep(self.batch_sizes)
        require(self.steps >= 1 and self.warmup_steps >= 0, "--steps must be >= 1, --warmup-steps >= 0")
        require(self.num_threads is None or self.num_threads >= 1, "--num-threads must be >= 1")


def profile_steps(model: PaddedModel, input_ids: Sequence[list[int]], batch_size: int, steps: int,
                  warmup_steps: int) -> dict[str, float]:
    """Mean milliseconds per decode step in each phase, and the cache length reached."""
    requests = [WorkerRequest(i, input_ids[i % len(input_ids)], SamplingParameters(), warmup_steps + steps + 2, True)
                for i in range(batch_size)]
    batch = CausalLMBatch.from_requests(requests, 1, 2**62, model)
    for _ in range(warmup_steps + 1):
        _, next_batch, _ = model.generate_token(batch)
        assert next_batch is not None, "the requests run past the warmup steps"
        batch = next_batch
    totals = dict.fromkeys(PHASES, 0.0)
    with torch.inference_mode():
        for _ in range(steps):
            times = [time.perf_counter()]
            logits, step_cache = model.forward(batch)
            times.append(time.perf_counter())
            next_ids, logprobs = batch.chooser(logits[:, -1, :], *model._history(batch))
            times.append(time.perf_counter())
            rows = step_rows(next_ids, logprobs, batch.top_n_tokens)
            times.append(time.perf_counter())
            generations = model._generations(batch, rows, {})
            times.append(time.perf_counter())
            batch.advance(next_ids, step_cache)
            times.append(time.perf_counter())
            encode(StepResult(1, generations, batch.to_cached(), Timings()))
            times.append(time.perf_counter())
            for phase, start, end in zip(PHASES, times, times[1:]):
                totals[phase] += end - start
    result = {phase: 1000 * total / steps for phase, total in totals.items()}
    result["step"] = sum(result.values())
    result["kv_length"] = batch.max_input_length
    return result


def render(batch_size: int, result: dict[str, float]) -> str:
    parts = ", ".join(f"{phase} {result[phase]:.2f}" for phase in PHASES)
    share = 100 * result["forward"] / result["step"]
    return (f"batch {batch_size:3d} (cache ~{result['kv_length']:.0f} positions): step {result['step']:.1f} ms "
            f"= {parts} ms; forward {share:.1f}%\n")


def main(argv: Sequence[str] | None = None) -> int:
    setup = parse_workload(StepProfileConfig, argv, "step_profile")
    if setup is None:
        return 2
    config, prompts = setup
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    input_ids = [r.input_ids for r in encode_prompts(load_tokenizer(config.model_id), prompts)]
    model = load_padded_model(config.model_id, config.dtype, config.device, config.backend, quantize=config.quantize)
    for batch_size in parse_sweep(config.batch_sizes):
        result = profile_steps(model, input_ids, batch_size, config.steps, config.warmup_steps)
        sys.stdout.write(render(batch_size, result))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
