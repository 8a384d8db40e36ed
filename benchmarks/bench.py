"""`ztgi bench`: runs the load levels asked for, prints the figures, writes JSON and a plot."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from ztgi.bench.config import BenchConfig
from ztgi.bench.load_generator import LoadGenerator, RunResult
from ztgi.bench.report import render_text, write_json
from ztgi.bench.workload import WorkloadError, build_workload
from ztgi.common.config import ConfigError, parse_config
from ztgi.common.logs import setup_logging

logger = logging.getLogger(__name__)

T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when some request succeeded, 1 when all failed, 2 for a bad flag or dataset, 130 on ^C."""
    try:
        config = parse_config(BenchConfig, argv, prog="ztgi bench serve")
        setup_logging("bench", config.log_level)
        prompts = build_workload(config)
    except (ConfigError, WorkloadError) as exc:
        setup_logging("bench")
        logger.error("%s", exc)
        return 2
    try:
        runs = run_event_loop(run_levels(config, LoadGenerator(config, prompts)))
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


async def run_levels(config: BenchConfig, generator: LoadGenerator) -> list[RunResult]:
    """One run per concurrency level, one after the other."""
    return [await generator.run(concurrency) for concurrency in config.concurrencies]


def run_event_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs `coroutine` on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
