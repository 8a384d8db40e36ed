"""What the pipeline adds to each worker step, read off a running server under load.

    python -m studies.pipeline_costs --url http://127.0.0.1:8080 --dataset mixed --concurrency 1 --num-requests 16

`studies.step_profile` splits a step inside the worker; this tool measures the rest. It reads
`/metrics` before and after one `ztgi bench` load level and splits the scheduler's round trip of
each Prefill and Decode (`tgi_batch_inference_duration`: sent to answer received) into what the
worker reported (forward, next-token choice and Generation building, concatenate) and the
remainder: the worker's idle time between steps, spent in messages, the worker's IO thread and
the scheduler; and each Filter's round trip (finished requests leaving the batch). It also
reports the CPU seconds each ztgi service process on this machine used during the level (from
/proc; absent when the server runs elsewhere or in containers), per output token: the
pipeline's processes share the cores with the worker's compute threads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ztgi.bench.bench import run_event_loop
from ztgi.bench.config import BenchConfig
from ztgi.bench.load_generator import LoadGenerator
from ztgi.bench.workload import WorkloadError, build_workload
from ztgi.common.config import ConfigError, parse_config
from ztgi.common.logs import setup_logging

logger = logging.getLogger(__name__)

STEP_PARTS = (("forward", "tgi_batch_forward_duration"), ("choose", "tgi_batch_decode_duration"))
SERVICES = ("gateway", "tokenizer", "scheduler", "worker")

Totals = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, sorted labels) -> value, for every `_sum` and `_count` sample of /metrics."""


def parse_totals(metrics_text: str) -> Totals:
    """The `_sum` and `_count` samples of a Prometheus text page."""
    totals: Totals = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")):
                totals[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return totals


def mean_ms(before: Totals, after: Totals, histogram: str, labels: dict[str, str]) -> tuple[int, float | None]:
    """Observations of `histogram` between the two pages and their mean in ms (None without any)."""
    key = tuple(sorted(labels.items()))
    count = after.get((f"{histogram}_count", key), 0.0) - before.get((f"{histogram}_count", key), 0.0)
    total = after.get((f"{histogram}_sum", key), 0.0) - before.get((f"{histogram}_sum", key), 0.0)
    return int(count), (1000.0 * total / count if count else None)


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """Mean ms per step of one method (prefill or decode) over the load level."""

    method: str
    num_steps: int
    round_trip_ms: float
    parts_ms: dict[str, float]

    @property
    def between_steps_ms(self) -> float:
        """The round trip less what the worker reported: messages, IO thread and scheduler."""
        return self.round_trip_ms - sum(self.parts_ms.values())


def step_costs(before: Totals, after: Totals, method: str) -> StepCosts | None:
    """The split of `method`'s steps, or None when the level ran none."""
    num_steps, round_trip_ms = mean_ms(before, after, "tgi_batch_inference_duration", {"method": method})
    if round_trip_ms is None:
        return None
    parts = {part: mean_ms(before, after, histogram, {"method": method})[1] or 0.0
             for part, histogram in STEP_PARTS}
    if method == "decode":
        parts["concatenate"] = mean_ms(before, after, "tgi_batch_concat_duration", {})[1] or 0.0
    return StepCosts(method, num_steps, round_trip_ms, parts)


def service_cpu_seconds() -> dict[int, tuple[str, float]]:
    """pid -> (service, CPU seconds so far) for every `python -m ztgi.services.<name>` on this machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                argv = file.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        service = _service_of(argv)
        if service is not None:
            found[int(pid)] = (service, (int(fields[11]) + int(fields[12])) / ticks)  # utime + stime
    return found


def _service_of(argv: list[bytes]) -> str | None:
    for flag, module in zip(argv, argv[1:]):
        if flag == b"-m" and module.startswith(b"ztgi.services."):
            name = module.decode(errors="replace").removeprefix("ztgi.services.")
            return name if name in SERVICES else None
    return None


def cpu_used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per service between two snapshots (processes present in both)."""
    used: dict[str, float] = {}
    for pid, (service, seconds) in after.items():
        if pid in before:
            used[service] = used.get(service, 0.0) + seconds - before[pid][1]
    return used


async def _fetch_metrics(url: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as response:
            response.raise_for_status()
            return await response.text()


async def measure(config: BenchConfig, generator: LoadGenerator) -> str:
    """Runs one level between two /metrics pages; the report as text."""
    before, cpu_before = parse_totals(await _fetch_metrics(config.url)), service_cpu_seconds()
    run = await generator.run(config.concurrencies[0])
    after, cpu_after = parse_totals(await _fetch_metrics(config.url)), service_cpu_seconds()
    steps = [costs for method in ("prefill", "decode") if (costs := step_costs(before, after, method))]
    filters = mean_ms(before, after, "tgi_batch_filter_duration", {})
    return render(steps, filters, cpu_used(cpu_before, cpu_after), run.summary.num_output_tokens,
                  run.summary.duration_s, run.summary.output_token_throughput)


def render(steps: list[StepCosts], filters: tuple[int, float | None], cpu: dict[str, float], num_tokens: int,
           duration_s: float, throughput: float) -> str:
    """The report; `filters` is (count, mean round trip in ms) of the Filter commands."""
    lines = [f"{num_tokens} output tokens in {duration_s:.1f} s ({throughput:.1f} tok/s)",
             "method   steps  round trip  " + "  ".join(f"{p:>11s}" for p in ("forward", "choose", "concatenate"))
             + "  between steps (ms per step)"]
    for costs in steps:
        parts = "  ".join(f"{costs.parts_ms.get(p, 0.0):11.2f}" for p in ("forward", "choose", "concatenate"))
        share = 100.0 * costs.between_steps_ms / costs.round_trip_ms
        lines.append(f"{costs.method:8s} {costs.num_steps:6d}  {costs.round_trip_ms:10.2f}  {parts}"
                     f"  {costs.between_steps_ms:6.2f} ({share:.1f}%)")
    if filters[1] is not None:
        lines.append(f"filter   {filters[0]:6d}  {filters[1]:10.2f}  (round trip)")
    if cpu:
        lines.append("service     CPU s   ms per output token")
        lines += [f"{service:10s} {seconds:6.1f}   {1000.0 * seconds / max(num_tokens, 1):6.2f}"
                  for service, seconds in sorted(cpu.items())]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 with a report, 1 when /metrics could not be read, 2 for a bad flag or dataset."""
    try:
        config = parse_config(BenchConfig, argv, prog="python -m studies.pipeline_costs")
        setup_logging("pipeline_costs", config.log_level)
        generator = LoadGenerator(config, build_workload(config))
    except (ConfigError, WorkloadError) as exc:
        setup_logging("pipeline_costs")
        logger.error("%s", exc)
        return 2
    try:
        report = run_event_loop(measure(config, generator))
    except (TimeoutError, aiohttp.ClientError) as exc:
        logger.error("could not read %s/metrics: %s", config.url, exc)
        return 1
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
