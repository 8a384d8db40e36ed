"""`ztgi bench`: runs the load levels asked for, prints the figures, writes JSON and a plot."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ztgi.bench.config import BenchConfig
from ztgi.bench.load_generator import LoadGenerator, RunResult
from ztgi.bench.report import render_text, write_json
from ztgi.bench.workload import Prompt, WorkloadError, build_workload
from ztgi.common.config import ConfigError, parse_config
from ztgi.common.logs import setup_logging

logger = logging.getLogger(__name__)

T = TypeVar("T")
C = TypeVar("C", bound=BenchConfig)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when some request succeeded, 1 when all failed, 2 for a bad flag or dataset, 130 on ^C."""
    parsed = parse_workload_config(BenchConfig, argv, "ztgi bench serve")
    return 2 if parsed is None else measure_and_report(*parsed, run_levels)


def parse_workload_config(config_class: type[C], argv: Sequence[str] | None, prog: str,
                          adjust: Callable[[C], C] | None = None) -> tuple[C, list[Prompt]] | None:
    """The flags as `config_class` (then `adjust`ed) and its workload; None after logging a bad flag or dataset."""
    try:
        config = parse_config(config_class, argv, prog=prog)
        config = adjust(config) if adjust else config
        setup_logging("bench", config.log_level)
        return config, build_workload(config)
    except (ConfigError, WorkloadError) as exc:
        setup_logging("bench")
        logger.error("%s", exc)
        return None


def measure_and_report(config: C, prompts: list[Prompt],
                       measure: Callable[[C, list[Prompt]], Coroutine[Any, Any, list[RunResult]]]) -> int:
    """Runs `measure`, prints its runs, writes the JSON and plot asked for; the exit status of `main`."""
    try:
        runs = run_event_loop(measure(config, prompts))
    except KeyboardInterrupt:
        logger.warning("interrupted: no results")
        return 130
    sys.stdout.write(render_text(config, runs))
    if config.output:
        write_json(config.output, config, runs)
        logger.info("wrote %s", config.output)
    if config.plot:
        from ztgi.bench.plot import write_plot
        write_plot(config.plot, runs)
        logger.info("wrote %s", config.plot)
    num_successes = sum(r.summary.num_requests - r.summary.num_failures for r in runs)
    return 0 if num_successes else 1


async def run_levels(config: BenchConfig, prompts: list[Prompt]) -> list[RunResult]:
    """One run per concurrency level, one after the other."""
    generator = LoadGenerator(config, prompts)
    return [await generator.run(concurrency) for concurrency in config.concurrencies]


def run_event_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs `coroutine` on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
