"""Offline throughput: `ztgi.LLM.generate` on the whole workload at once, beside the baselines.

    ztgi bench throughput --dataset mixed --dtype float32 --repeats 3 --output offline.json
    ztgi bench --offline --dataset mixed --dtype float32       # the same

Each repeat runs static batching (`transformers` `generate`, batch `--static-batch-size`; in the
first `--static-repeats` only, when given), then the engine alone (the worker's model under the
scheduler's batching rule, `--engine-concurrency` requests in flight, by default all of them) and
`LLM.generate` given every prompt in one call, these two in turns (which goes first alternates, so a
drift in the machine's speed hits both alike).
The workload is the one `ztgi bench compare` runs: the same prompts in the same order, each with its
dataset `max_new_tokens`, greedy, `--ignore-eos` on by default so every system generates the same
tokens. `LLM.generate` gets the prompts as text and returns text: its time includes encoding and
detokenizing, which the engine alone skips. Every system is warmed up first. The table gives the
medians over `--repeats` and the two ratios the offline API claims: at least the engine alone's
throughput, and at least 5x static batching's.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_model, load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.engine_alone import EngineAlone, EngineModel
from ztgi.bench.metrics import RequestRecord, summarize
from ztgi.bench.offline_workload import encode_prompts
from ztgi.bench.static_batching import StaticBatching
from ztgi.bench.workload import Prompt
from ztgi.common.config import require

logger = logging.getLogger(__name__)

MIN_ENGINE_FRACTION = 1.0
MIN_STATIC_SPEEDUP = 5.0


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class OfflineConfig(BaselineConfig):
    """`LLM.generate` over the whole workload, beside static batching and the engine alone."""

    ignore_eos: bool = dataclasses.field(default=True, metadata=_help(
        "every request generates exactly its max_new_tokens on every system"))
    static_batch_size: int = dataclasses.field(default=16, metadata=_help("batch size of static batching"))
    engine_concurrency: int | None = dataclasses.field(default=None, metadata=_help(
        "requests in flight for the engine alone (default: every prompt, as LLM.generate has them)"))
    baselines: bool = dataclasses.field(default=True, metadata=_help(
        "run static batching and the engine alone beside LLM.generate"))
    repeats: int = dataclasses.field(default=1, metadata=_help("runs of everything; figures are medians"))
    static_repeats: int | None = dataclasses.field(default=None, metadata=_help(
        "run static batching in the first N repeats only (default: every repeat); it is the slow one"))
    progress: bool = dataclasses.field(default=False, metadata=_help("LLM.generate's progress bar"))
    kv_cache: str = dataclasses.field(default="auto", metadata=_help(
        "LLM's KV cache layout (paged, padded or auto: what LLM() picks, paged for SmolLM2); the engine "
        "alone runs padded"))
    num_threads: int | None = dataclasses.field(default=None, metadata=_help(
        "torch CPU threads for every system (default: torch's, every core)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.static_batch_size >= 1, f"--static-batch-size must be >= 1, got {self.static_batch_size}")
        require(self.engine_concurrency is None or self.engine_concurrency >= 1,
                f"--engine-concurrency must be >= 1, got {self.engine_concurrency}")
        require(self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}")
        require(self.num_threads is None or self.num_threads >= 1,
                f"--num-threads must be >= 1, got {self.num_threads}")
        require(self.static_repeats is None or self.static_repeats >= 0,
                f"--static-repeats must be >= 0, got {self.static_repeats}")


class OfflineLLM:
    """`LLM.generate` on every prompt in one call, timed from the call to its return."""

    def __init__(self, config: OfflineConfig) -> None:
        from ztgi import LLM

        self.config = config
        # no prefix cache: the warmup and every repeat send the same prompts, which the engine alone
        # computes each time
        self.llm = LLM(config.model_id, dtype=config.dtype, device=config.device, backend=config.backend,
                       kv_cache=config.kv_cache, prefix_caching=False)

    def warmup(self, prompts: Sequence[Prompt]) -> None:
        self._generate([dataclasses.replace(prompt, max_new_tokens=2) for prompt in prompts])

    def run(self, prompts: Sequence[Prompt]) -> BaselineRun:
        started = time.perf_counter()
        outputs = self._generate(prompts)
        duration_s = time.perf_counter() - started
        records = [RequestRecord(index, prompt.max_new_tokens, len(output.prompt_token_ids),
                                 num_output_tokens=len(output.outputs[0].token_ids))
                   for index, (prompt, output) in enumerate(zip(prompts, outputs))]
        return BaselineRun("offline", len(prompts), records, summarize(records, duration_s))

    def _generate(self, prompts: Sequence[Prompt]) -> list:
        from ztgi import SamplingParams

        params = [SamplingParams(temperature=0, max_tokens=prompt.max_new_tokens, ignore_eos=self.config.ignore_eos)
                  for prompt in prompts]
        return self.llm.generate([prompt.text for prompt in prompts], params, use_tqdm=self.config.progress)


def run_all(config: OfflineConfig, prompts: list[Prompt]) -> list[BaselineRun]:
    """Loads every system, warms each up, and runs `repeats` rounds."""
    offline = OfflineLLM(config)
    offline.warmup(prompts)
    if not config.baselines:
        return [_tagged(lambda: offline.run(prompts), repeat) for repeat in range(config.repeats)]
    tokenizer = load_tokenizer(config.model_id)
    requests = encode_prompts(tokenizer, prompts)
    static = StaticBatching(load_model(config.model_id, config.dtype, config.device), tokenizer,
                            config.static_batch_size, config.ignore_eos)
    engine = EngineAlone(dataclasses.replace(EngineModel.of(config), quantize="none"), ignore_eos=config.ignore_eos)
    concurrency = config.engine_concurrency or len(requests)
    static.warmup(requests)
    engine.warmup(requests[:concurrency])
    runs: list[BaselineRun] = []
    for repeat in range(config.repeats):
        if config.static_repeats is None or repeat < config.static_repeats:
            logger.info("repeat %d/%d: static batching at batch %d", repeat + 1, config.repeats,
                        config.static_batch_size)
            runs.append(_tagged(lambda: static.run(requests), repeat))
        turns = [lambda: engine.run(requests, concurrency), lambda: offline.run(prompts)]
        for turn in turns if repeat % 2 == 0 else turns[::-1]:
            runs.append(_tagged(turn, repeat))
    return runs


def _tagged(run_one: Callable[[], BaselineRun], repeat: int) -> BaselineRun:
    """Runs one system once; `cpu_s` is this process's CPU time over the run (steadier than the wall
    clock on a shared machine: what each system costs, not what the neighbours leave it)."""
    cpu_started = time.process_time()
    run = run_one()
    run.extra.update(repeat=repeat, cpu_s=time.process_time() - cpu_started)
    logger.info("%s@%d: %.1f tok/s over %.1f s (%.1f s CPU)", run.system, run.concurrency,
                run.summary.output_token_throughput, run.summary.duration_s, run.extra["cpu_s"])
    return run


def throughputs(runs: Sequence[BaselineRun], system: str) -> list[float]:
    """Output tokens/s of `system`, one per repeat in order."""
    return [run.summary.output_token_throughput for run in sorted(runs, key=lambda r: r.extra["repeat"])
            if run.system == system]


def ratios(runs: Sequence[BaselineRun], system: str, bound: float) -> dict[str, Any]:
    """offline / `system`: the ratio of the medians, each repeat's own ratio, and whether >= bound."""
    offline, other = throughputs(runs, "offline"), throughputs(runs, system)
    if not offline or not other:
        return {}
    value = statistics.median(offline) / statistics.median(other)
    return {"value": value, "per_repeat": [a / b for a, b in zip(offline, other)], "bound": bound,
            "passed": value >= bound}  # per repeat: the first repeats only when static ran in fewer


def cpu_per_token_ms(runs: Sequence[BaselineRun], system: str) -> float | None:
    values = [1000 * run.extra["cpu_s"] / run.summary.num_output_tokens for run in runs
              if run.system == system and run.summary.num_output_tokens]
    return statistics.median(values) if values else None


def render_text(runs: Sequence[BaselineRun]) -> str:
    lines = ["| system | in flight | output tok/s (median) | per repeat | req/s | duration s | output tokens |",
             "|---|---|---|---|---|---|---|"]
    for system in ("static", "engine", "offline"):
        mine = [run for run in runs if run.system == system]
        if not mine:
            continue
        values = throughputs(runs, system)
        median_run = min(mine, key=lambda r: abs(r.summary.output_token_throughput - statistics.median(values)))
        s = median_run.summary
        lines.append(f"| {system} | {median_run.concurrency} | {statistics.median(values):.1f} | "
                     f"{' / '.join(f'{v:.1f}' for v in values)} | {s.request_throughput:.2f} | {s.duration_s:.1f} | "
                     f"{s.num_output_tokens} |")
    engine_cpu, offline_cpu = cpu_per_token_ms(runs, "engine"), cpu_per_token_ms(runs, "offline")
    if engine_cpu and offline_cpu:
        lines.append(f"CPU per output token (median): engine {engine_cpu:.2f} ms, offline {offline_cpu:.2f} ms "
                     f"({offline_cpu / engine_cpu:.3f}x)")
    for system, bound in (("engine", MIN_ENGINE_FRACTION), ("static", MIN_STATIC_SPEEDUP)):
        claim = ratios(runs, system, bound)
        if claim:
            per_repeat = " / ".join(f"{v:.2f}" for v in claim["per_repeat"])
            verdict = "met" if claim["passed"] else "NOT MET"
            lines.append(f"offline / {system}: {claim['value']:.2f}x ({per_repeat}), needs >= {bound:g}x: {verdict}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the table; exit 2 for a bad flag or dataset."""
    setup = parse_workload(OfflineConfig, argv, "throughput")
    if setup is None:
        return 2
    config, prompts = setup
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    runs = run_all(config, prompts)
    sys.stdout.write(render_text(runs))
    if config.output:
        write_results(config.output, {
            "config": dataclasses.asdict(config), "runs": [run.to_json(with_requests=False) for run in runs],
            "claims": {system: ratios(runs, system, bound)
                       for system, bound in (("engine", MIN_ENGINE_FRACTION), ("static", MIN_STATIC_SPEEDUP))}})
        logger.info("wrote %s", config.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
