"""`ztgi bench latency`: one request at a time against a running server, a single stream's latency.

    ztgi bench latency --url http://127.0.0.1:8080 --input-tokens 128 --output-tokens 128 --num-requests 20

The same client as `ztgi bench serve` (so the figures mean what they mean there: TTFT, TPOT, ITL
and E2E from the client's clock, HTTP included), pinned to one request in flight: nothing queues
behind anything, so TTFT is the server's prefill and pipeline and TPOT its decode step for a
batch of one. `--warmup-requests` are sent first and not counted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from ztgi.bench.bench import measure_and_report, parse_workload_config
from ztgi.bench.config import BenchConfig
from ztgi.bench.load_generator import LoadGenerator, RunResult
from ztgi.bench.workload import Prompt
from ztgi.common.config import require

logger = logging.getLogger(__name__)

DEFAULT_NUM_REQUESTS = 20


@dataclasses.dataclass(frozen=True)
class LatencyConfig(BenchConfig):
    """`ztgi bench latency`: serve's flags at one request in flight (--concurrency, --request-rate and
    --sweep are refused); --num-requests defaults to 20."""

    warmup_requests: int = dataclasses.field(default=2, metadata={
        "help": "requests sent first and not counted"})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.concurrency in (None, 1), "latency runs one request at a time: drop --concurrency")
        require(self.request_rate is None and self.sweep is None,
                "latency runs one request at a time: drop --request-rate and --sweep")
        require(self.warmup_requests >= 0, f"--warmup-requests must be >= 0, got {self.warmup_requests}")


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when some request succeeded, 1 when all failed, 2 for a bad flag or dataset, 130 on ^C."""
    parsed = parse_workload_config(LatencyConfig, argv, "ztgi bench latency", _default_request_count)
    return 2 if parsed is None else measure_and_report(*parsed, one_at_a_time)


def _default_request_count(config: LatencyConfig) -> LatencyConfig:
    if config.num_requests is None and config.duration_s is None:
        return dataclasses.replace(config, num_requests=DEFAULT_NUM_REQUESTS)
    return config


async def one_at_a_time(config: LatencyConfig, prompts: list[Prompt]) -> list[RunResult]:
    """The warmup requests, then the counted ones, each sent when the one before has ended."""
    if config.warmup_requests:
        warmup = dataclasses.replace(config, num_requests=config.warmup_requests, duration_s=None, progress=False)
        await LoadGenerator(warmup, prompts).run(1)
    return [await LoadGenerator(config, prompts).run(1)]
