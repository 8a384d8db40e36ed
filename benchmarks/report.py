"""The results as text for a terminal and as JSON for a file."""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence

from ztgi.bench.config import BenchConfig
from ztgi.bench.load_generator import RunResult
from ztgi.bench.metrics import Distribution, Summary

LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))
MAX_ERRORS_SHOWN = 3


def results_json(config: BenchConfig, runs: Sequence[RunResult]) -> dict:
    """`{config, runs: [{concurrency, request_rate, summary, requests}]}`; times in seconds."""
    return {"config": dataclasses.asdict(config), "runs": [run.to_json() for run in runs]}


def write_json(path: str, config: BenchConfig, runs: Sequence[RunResult]) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(results_json(config, runs), file, indent=1)
        file.write("\n")


def render_text(config: BenchConfig, runs: Sequence[RunResult]) -> str:
    """Every run's figures, then a one-line-per-level table when there are several."""
    lines = [f"ztgi bench: {config.backend} at {config.url}"
             + (", ignore_eos" if config.ignore_eos else "")]
    for run in runs:
        lines += ["", f"--- {load_label(run)} ---", *_render_summary(run.summary), *_render_errors(run)]
    if len(runs) > 1:
        lines += ["", *_render_sweep(runs)]
    return "\n".join(lines) + "\n"


def load_label(run: RunResult) -> str:
    label = f"concurrency {run.concurrency or 'unbounded'}"
    return label + (f", {run.request_rate:g} req/s Poisson" if run.request_rate else "")


def _render_summary(summary: Summary) -> list[str]:
    lines = [
        f"requests            {summary.num_requests} ({summary.num_failures} failed) in {summary.duration_s:.2f} s",
        f"request throughput  {summary.request_throughput:.2f} req/s",
        f"output throughput   {summary.output_token_throughput:.1f} tok/s ({summary.num_output_tokens} tokens)",
        f"{'latency (ms)':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name, field in LATENCIES:
        lines.append(f"{name:<12}" + "".join(_ms(v) for v in _stats(getattr(summary, field))))
    return lines


def _stats(distribution: Distribution) -> tuple[float | None, ...]:
    return distribution.mean, distribution.p50, distribution.p90, distribution.p99


def _ms(seconds: float | None, width: int = 10) -> str:
    return f"{'-':>{width}}" if seconds is None else f"{seconds * 1000:>{width}.1f}"


def _render_errors(run: RunResult) -> list[str]:
    counts = collections.Counter(r.error for r in run.records if r.error is not None)
    return [f"failed {count}x: {error}" for error, count in counts.most_common(MAX_ERRORS_SHOWN)]


def _render_sweep(runs: Sequence[RunResult]) -> list[str]:
    header = (f"{'concurrency':>11}{'req/s':>9}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'TPOT p50':>10}{'TPOT p99':>10}{'E2E p50':>10}{'failed':>8}")
    lines = ["sweep (latencies in ms)", header]
    for run in runs:
        s = run.summary
        lines.append(f"{run.concurrency or '-':>11}{s.request_throughput:>9.2f}{s.output_token_throughput:>9.1f}"
                     f"{_ms(s.ttft_s.p50)}{_ms(s.ttft_s.p99)}{_ms(s.tpot_s.p50)}{_ms(s.tpot_s.p99)}"
                     f"{_ms(s.e2e_s.p50)}{s.num_failures:>8}")
    return lines
