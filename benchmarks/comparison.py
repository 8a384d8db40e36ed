"""The side-by-side figures: medians over repeats, the ratios the product claims, and a table.

The claims (issue "Benchmark tool, and serving throughput well beyond static batching"), on the
same workload: ztgi's output tokens/s at each throughput level is at least 3x static batching at
its batch size and at least 90% of the engine alone at the same level; at one request at a time,
ztgi's TTFT (p50) is within 10% of the engine alone. When ztgi also ran with `--kv-cache padded`
(system `padded`, `compare --padded`), issue 14's claim: ztgi (paged) makes at least 1.3x the
padded worker's output tokens/s at each throughput level.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from ztgi.bench.baseline_run import BaselineRun

MIN_STATIC_SPEEDUP = 3.0
MIN_ENGINE_FRACTION = 0.9
MAX_TTFT_OVERHEAD = 1.1
MIN_PADDED_SPEEDUP = 1.3
TTFT_CONCURRENCY = 1
SYSTEMS = ("static", "engine", "ztgi", "padded")


@dataclasses.dataclass(frozen=True)
class Claim:
    """One ratio and the bound the product promises for it."""

    name: str
    value: float | None
    bound: float
    at_least: bool

    @property
    def passed(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "bound": self.bound,
                "at_least": self.at_least, "passed": self.passed}


def figures(run: BaselineRun) -> dict[str, float | None]:
    """The figures of one run the table shows; latencies in seconds."""
    s = run.summary
    return {
        "output_token_throughput": s.output_token_throughput, "request_throughput": s.request_throughput,
        "ttft_p50_s": s.ttft_s.p50, "tpot_p50_s": s.tpot_s.p50, "e2e_p50_s": s.e2e_s.p50,
        "num_output_tokens": s.num_output_tokens, "num_failures": s.num_failures, "duration_s": s.duration_s,
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


class Comparison:
    """All runs of a comparison (every repeat), and what they add up to."""

    def __init__(self, runs: Sequence[BaselineRun], static_batch_size: int, concurrencies: Sequence[int]) -> None:
        self.runs = list(runs)
        self.static_batch_size = static_batch_size
        self.concurrencies = list(concurrencies)

    def levels(self) -> list[tuple[str, int]]:
        """(system, concurrency) pairs that were run, in table order."""
        present = {(run.system, run.concurrency) for run in self.runs}
        return sorted(present, key=lambda level: (SYSTEMS.index(level[0]), level[1]))

    def median(self, system: str, concurrency: int) -> dict[str, float | None] | None:
        """Each figure's median over the repeats of one level; None when the level was not run."""
        repeats = [figures(run) for run in self.runs if (run.system, run.concurrency) == (system, concurrency)]
        if not repeats:
            return None
        return {name: _median([r[name] for r in repeats]) for name in repeats[0]}

    def _figure(self, system: str, concurrency: int, name: str) -> float | None:
        medians = self.median(system, concurrency)
        return None if medians is None else medians[name]

    def claims(self) -> list[Claim]:
        throughput = "output_token_throughput"
        static = self._figure("static", self.static_batch_size, throughput)
        claims = []
        for level in self.concurrencies:
            ztgi = self._figure("ztgi", level, throughput)
            claims.append(Claim(f"tok/s ztgi@{level} / static@{self.static_batch_size}",
                                _ratio(ztgi, static), MIN_STATIC_SPEEDUP, at_least=True))
            claims.append(Claim(f"tok/s ztgi@{level} / engine@{level}",
                                _ratio(ztgi, self._figure("engine", level, throughput)),
                                MIN_ENGINE_FRACTION, at_least=True))
            padded = self._figure("padded", level, throughput)
            if padded is not None:
                claims.append(Claim(f"tok/s ztgi@{level} / padded@{level}", _ratio(ztgi, padded),
                                    MIN_PADDED_SPEEDUP, at_least=True))
        claims.append(Claim(f"TTFT p50 ztgi@{TTFT_CONCURRENCY} / engine@{TTFT_CONCURRENCY}",
                            _ratio(self._figure("ztgi", TTFT_CONCURRENCY, "ttft_p50_s"),
                                   self._figure("engine", TTFT_CONCURRENCY, "ttft_p50_s")),
                            MAX_TTFT_OVERHEAD, at_least=False))
        return claims

    def to_json(self) -> dict[str, Any]:
        medians = [{"system": system, "concurrency": level, **(self.median(system, level) or {})}
                   for system, level in self.levels()]
        return {"medians": medians, "claims": [claim.to_json() for claim in self.claims()]}

    def render_text(self) -> str:
        """The median table, then each claim with its verdict."""
        num_repeats = max((sum(1 for r in self.runs if (r.system, r.concurrency) == level)
                           for level in self.levels()), default=0)
        lines = [f"medians over {num_repeats} repeat(s); latencies in ms",
                 f"{'system':<8}{'level':>6}{'tok/s':>9}{'req/s':>8}{'TTFT p50':>10}{'TPOT p50':>10}"
                 f"{'E2E p50':>10}{'tokens':>8}{'failed':>7}"]
        for system, level in self.levels():
            m = self.median(system, level) or {}
            lines.append(f"{system:<8}{level:>6}{m['output_token_throughput']:>9.1f}{m['request_throughput']:>8.2f}"
                         f"{_ms(m['ttft_p50_s'])}{_ms(m['tpot_p50_s'])}{_ms(m['e2e_p50_s'])}"
                         f"{m['num_output_tokens']:>8.0f}{m['num_failures']:>7.0f}")
        lines += ["", f"{'claim':<34}{'value':>8}{'bound':>9}  verdict"]
        for claim in self.claims():
            value = "-" if claim.value is None else f"{claim.value:.2f}"
            bound = f"{'>=' if claim.at_least else '<='} {claim.bound:.2f}"
            verdict = {True: "PASS", False: "FAIL", None: "not measured"}[claim.passed]
            lines.append(f"{claim.name:<34}{value:>8}{bound:>9}  {verdict}")
        return "\n".join(lines) + "\n"


def _ms(seconds: float | None) -> str:
    return f"{'-':>10}" if seconds is None else f"{seconds * 1000:>10.1f}"
