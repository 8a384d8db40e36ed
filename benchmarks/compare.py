"""Side by side in one run: static batching, the engine alone, and ztgi over HTTP.

    ztgi bench compare --dataset mixed --dtype float32 --repeats 3 \\
        --output results.json --plot sweep.png

On one machine, one run at a time, each repeat runs static batching (`transformers` `generate`,
batch `--static-batch-size`), then at each of `--concurrencies` the worker engine in-process and,
right after it, ztgi (`ztgi launch` started here on a free port, loaded by `ztgi bench`'s load
generator over `/generate_stream`); at concurrency 1 the two take turns of `--ttft-turn` requests.
Every system is warmed up first with two-token requests at its largest batch. With the defaults
(the whole mixed set) a repeat takes minutes on a few CPU cores; `--max-requests` shortens it. The
workload is identical for all: the same prompts in the same order, the same `max_new_tokens`, the
ids ztgi's tokenizer makes, greedy, the same model and dtype, and `--ignore-eos` (on by default, so
every system generates exactly the same number of tokens). The concurrency-1 runs measure TTFT and
use only the first `--ttft-requests` prompts. Each figure is the median over `--repeats`; the table
ends with the ratios the product claims (see `benchmarks/comparison.py`). `--padded` adds a second
ztgi, launched with `--kv-cache padded` (system `padded`, the same limits and `--memory-budget-mb`),
run right after ztgi at each throughput level. ztgi's limits
(`--max-total-tokens`, `--max-batch-prefill-tokens`, ...) go to `ztgi launch`, and the batching
ones drive the engine alone as well; a model with fewer than 4096 positions needs a smaller
`--max-total-tokens`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Sequence

import aiohttp
from transformers import PreTrainedTokenizerBase

from ztgi.bench.baseline_config import BaselineConfig
from ztgi.bench.baseline_model import load_model, load_tokenizer
from ztgi.bench.baseline_run import BaselineRun, joined, write_results
from ztgi.bench.baseline_setup import parse_workload
from ztgi.bench.bench import run_event_loop
from ztgi.bench.comparison import TTFT_CONCURRENCY, Comparison
from ztgi.bench.config import BenchConfig, parse_sweep
from ztgi.bench.engine_alone import BatchingPolicy, EngineAlone, EngineModel
from ztgi.bench.launched_server import LaunchedServer, ServerStartError
from ztgi.bench.load_generator import LoadGenerator, RunResult, http_session
from ztgi.bench.offline_workload import OfflineRequest, encode_prompts
from ztgi.bench.static_batching import StaticBatching
from ztgi.bench.workload import Prompt
from ztgi.common.config import ConfigError, require
from ztgi.common.gc_freeze import freeze_startup_objects

logger = logging.getLogger(__name__)


LIMIT_NAMES = ("max_input_tokens", "max_total_tokens", "max_batch_prefill_tokens", "max_batch_size",
               "waiting_served_ratio", "max_waiting_tokens", "memory_budget_mb")
PADDED = "padded"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class CompareConfig(BaselineConfig):
    """Static batching, the engine alone and ztgi over HTTP on the same workload, side by side."""

    ignore_eos: bool = dataclasses.field(default=True, metadata=_help(
        "every request generates exactly its max_new_tokens on every system"))
    static_batch_size: int = dataclasses.field(default=16, metadata=_help("batch size of static batching"))
    concurrencies: str = dataclasses.field(default="16,32", metadata=_help(
        "throughput levels for the engine and ztgi (concurrency 1 is always run, for TTFT)"))
    ttft_requests: int = dataclasses.field(default=8, metadata=_help(
        "requests of the concurrency-1 runs (the first N prompts)"))
    ttft_turn: int = dataclasses.field(default=4, metadata=_help(
        "at concurrency 1 the engine and ztgi take turns of this many requests"))
    repeats: int = dataclasses.field(default=1, metadata=_help("runs of everything; figures are medians"))
    plot: str | None = dataclasses.field(default=None, metadata=_help("write a PNG of the comparison here"))
    port: int | None = dataclasses.field(default=None, metadata=_help("ztgi's HTTP port (default: a free one)"))
    padded: bool = dataclasses.field(default=False, metadata=_help(
        "also run ztgi launched with --kv-cache padded (system `padded`) right after ztgi at each throughput level"))
    startup_timeout_s: float = 600.0
    # ztgi's limits (unset: ztgi launch's defaults); the batching ones drive the engine alone too
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_batch_prefill_tokens: int = 4096
    max_batch_size: int | None = None
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    memory_budget_mb: int | None = None  # the workers' KV budget on CPU, the same for ztgi and padded

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.static_batch_size >= 1, f"--static-batch-size must be >= 1, got {self.static_batch_size}")
        throughput_levels(self.concurrencies)
        require(self.ttft_requests >= 1, f"--ttft-requests must be >= 1, got {self.ttft_requests}")
        require(self.ttft_turn >= 1, f"--ttft-turn must be >= 1, got {self.ttft_turn}")
        require(self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}")
        require(self.startup_timeout_s > 0, "--startup-timeout-s must be positive")
        require(self.max_batch_prefill_tokens >= 1, "--max-batch-prefill-tokens must be >= 1")
        require(self.max_batch_size is None or self.max_batch_size >= 1, "--max-batch-size must be >= 1")
        require(self.waiting_served_ratio >= 0, "--waiting-served-ratio must be >= 0")
        require(self.max_waiting_tokens >= 1, "--max-waiting-tokens must be >= 1")
        require(self.memory_budget_mb is None or self.memory_budget_mb >= 1, "--memory-budget-mb must be >= 1")

    @property
    def levels(self) -> list[int]:
        """Concurrency 1 (TTFT), then the throughput levels."""
        return [TTFT_CONCURRENCY, *(c for c in throughput_levels(self.concurrencies) if c != TTFT_CONCURRENCY)]

    def launch_flags(self, kv_cache: str | None = None) -> list[str]:
        """`ztgi launch`'s flags; `kv_cache` (e.g. "padded") picks the worker's KV layout, else its default.
        Prefix caching is off: the warmup and the repeats send the same prompts, which the engine alone
        and static batching compute each time."""
        flags = ["--model-id", self.model_id, "--dtype", self.dtype, "--device", self.device, "--backend", self.backend,
                 "--quantize", self.quantize, "--log-level", self.log_level, "--no-prefix-caching"]
        for name in LIMIT_NAMES:
            if getattr(self, name) is not None:
                flags += ["--" + name.replace("_", "-"), str(getattr(self, name))]
        return flags if kv_cache is None else [*flags, "--kv-cache", kv_cache]

    @property
    def policy(self) -> BatchingPolicy:
        return BatchingPolicy(max_batch_prefill_tokens=self.max_batch_prefill_tokens,
                              max_batch_size=self.max_batch_size, waiting_served_ratio=self.waiting_served_ratio,
                              max_waiting_tokens=self.max_waiting_tokens)


def throughput_levels(text: str) -> list[int]:
    """`16,32` as [16, 32]; ConfigError unless every level is an integer >= 1."""
    try:
        return parse_sweep(text)
    except ConfigError:
        raise ConfigError(f"--concurrencies {text!r} must be comma-separated integers >= 1, e.g. 16,32") from None


@dataclasses.dataclass(frozen=True)
class Workload:
    """The prompts (for HTTP) and the same prompts encoded (in process), in the same order."""

    prompts: list[Prompt]
    requests: list[OfflineRequest]

    def at(self, concurrency: int, ttft_requests: int) -> Workload:
        """All of it for a throughput level, the first `ttft_requests` for the TTFT level."""
        if concurrency != TTFT_CONCURRENCY:
            return self
        return Workload(self.prompts[:ttft_requests], self.requests[:ttft_requests])


class ZtgiOverHttp:
    """`ztgi bench`'s load generator against a launched server, one level at a time."""

    def __init__(self, url: str, config: CompareConfig, system: str = "ztgi") -> None:
        self.url = url
        self.config = config
        self.system = system

    def warmup(self, prompts: list[Prompt]) -> None:
        """Two-token requests, all at once, so no timed run finds cold connections or code paths."""
        self._run([dataclasses.replace(prompt, max_new_tokens=2) for prompt in prompts], len(prompts))

    def run(self, prompts: list[Prompt], concurrency: int) -> BaselineRun:
        return BaselineRun.from_bench(self.system, self._run(prompts, concurrency))

    def session(self) -> aiohttp.ClientSession:
        """A session whose connection `run_in` calls share (none of them pays for connecting)."""
        return http_session(self._bench(1).request_timeout_s)

    async def run_in(self, session: aiohttp.ClientSession, prompts: list[Prompt], concurrency: int) -> BaselineRun:
        return BaselineRun.from_bench(self.system, await self._generator(prompts).run_in(session, concurrency))

    def _run(self, prompts: list[Prompt], concurrency: int) -> RunResult:
        return run_event_loop(self._generator(prompts).run(concurrency))

    def _generator(self, prompts: list[Prompt]) -> LoadGenerator:
        return LoadGenerator(self._bench(len(prompts)), prompts)

    def _bench(self, num_requests: int) -> BenchConfig:
        return BenchConfig(url=self.url, dataset=self.config.dataset, output_tokens=self.config.output_tokens,
                           num_requests=num_requests, ignore_eos=self.config.ignore_eos, progress=False)


def run_comparison(config: CompareConfig, workload: Workload, tokenizer: PreTrainedTokenizerBase) -> list[BaselineRun]:
    """Loads both in-process baselines, starts ztgi, and runs every level `repeats` times."""
    static = StaticBatching(load_model(config.model_id, config.dtype, config.device), tokenizer,
                            config.static_batch_size, config.ignore_eos)
    engine = EngineAlone(EngineModel.of(config), config.policy, config.ignore_eos)
    max_level = max(config.levels)
    static.warmup(workload.requests)
    engine.warmup(workload.requests[:max_level], config.levels)
    freeze_startup_objects()  # as the worker does after its warmup: the models stay out of later collections
    runs: list[BaselineRun] = []
    with contextlib.ExitStack() as servers:
        server = servers.enter_context(LaunchedServer(config.launch_flags(), config.startup_timeout_s, config.port))
        ztgi = ZtgiOverHttp(server.url, config)
        ztgi.warmup(workload.prompts[:max_level])
        padded = None
        if config.padded:
            padded_server = servers.enter_context(LaunchedServer(config.launch_flags(PADDED), config.startup_timeout_s))
            padded = ZtgiOverHttp(padded_server.url, config, PADDED)
            padded.warmup(workload.prompts[:max_level])
        for repeat in range(config.repeats):
            runs += _one_repeat(config, workload, static, engine, ztgi, repeat, padded)
    return runs


def _one_repeat(config: CompareConfig, workload: Workload, static: StaticBatching, engine: EngineAlone,
                ztgi: ZtgiOverHttp, repeat: int, padded: ZtgiOverHttp | None = None) -> list[BaselineRun]:
    logger.info("repeat %d/%d: static batching at batch %d", repeat + 1, config.repeats, config.static_batch_size)
    runs = [static.run(workload.requests)]
    for level in config.levels:  # engine and ztgi back to back: a drift in machine load hits both alike
        logger.info("repeat %d/%d: engine alone and ztgi over HTTP at concurrency %d",
                    repeat + 1, config.repeats, level)
        if level == TTFT_CONCURRENCY:
            runs += run_event_loop(_in_turns(workload.at(level, config.ttft_requests), engine, ztgi, config.ttft_turn))
        else:
            runs.append(engine.run(workload.requests, level))
            runs.append(ztgi.run(workload.prompts, level))
            if padded is not None:  # right after ztgi, on its own idle server: the same load drift hits both
                runs.append(padded.run(workload.prompts, level))
    for run in runs:
        run.extra["repeat"] = repeat
        logger.info("%s@%d: %.1f tok/s", run.system, run.concurrency, run.summary.output_token_throughput)
    return runs


def turns(num_requests: int, turn: int) -> list[tuple[str, slice]]:
    """The concurrency-1 level's order: `turn` requests on one system, the same ones on the
    other, then the next ones, the first to go alternating: ("engine", 0:4), ("ztgi", 0:4),
    ("ztgi", 4:8), ("engine", 4:8), ..."""
    order = []
    for index, start in enumerate(range(0, num_requests, turn)):
        part = slice(start, min(start + turn, num_requests))
        pair = [("engine", part), ("ztgi", part)]
        order += pair if index % 2 == 0 else pair[::-1]
    return order


async def _in_turns(workload: Workload, engine: EngineAlone, ztgi: ZtgiOverHttp, turn: int) -> list[BaselineRun]:
    """The engine and ztgi taking turns of `turn` requests, joined into one run each: the speed of
    these machines drifts by 20-30% over minutes (BENCHMARKS.md), which running one system's
    whole level after the other's would add to the TTFT ratio. ztgi's turns share one HTTP
    connection, opened by an untimed two-token request, as one closed-loop run's would."""
    parts: dict[str, list[BaselineRun]] = {"engine": [], "ztgi": []}
    async with ztgi.session() as session:
        await ztgi.run_in(session, [dataclasses.replace(workload.prompts[0], max_new_tokens=2)], TTFT_CONCURRENCY)
        for system, part in turns(len(workload.prompts), turn):
            if system == "engine":
                parts[system].append(engine.run(workload.requests[part], TTFT_CONCURRENCY))
            else:
                parts[system].append(await ztgi.run_in(session, workload.prompts[part], TTFT_CONCURRENCY))
    return [joined(parts["engine"]), joined(parts["ztgi"])]


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every run completed, 1 when ztgi failed (to start, or requests), 2 for a bad flag."""
    setup = parse_workload(CompareConfig, argv, "compare")
    if setup is None:
        return 2
    config, prompts = setup
    tokenizer = load_tokenizer(config.model_id)
    workload = Workload(prompts, encode_prompts(tokenizer, prompts))
    try:
        runs = run_comparison(config, workload, tokenizer)
    except ServerStartError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.warning("interrupted: no results")
        return 130
    comparison = Comparison(runs, config.static_batch_size, throughput_levels(config.concurrencies))
    sys.stdout.write(comparison.render_text())
    _write_outputs(config, runs, comparison)
    return 1 if any(run.summary.num_failures for run in runs) else 0


def _write_outputs(config: CompareConfig, runs: list[BaselineRun], comparison: Comparison) -> None:
    if config.output:
        write_results(config.output, {"config": dataclasses.asdict(config), **comparison.to_json(),
                                      "runs": [run.to_json() for run in runs]})
        logger.info("wrote %s", config.output)
    if config.plot:
        from ztgi.bench.comparison_plot import write_plot
        write_plot(config.plot, comparison)
        logger.info("wrote %s", config.plot)


if __name__ == "__main__":
    sys.exit(main())
