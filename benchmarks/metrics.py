"""The figures: one `RequestRecord` per request, summarized into a `Summary` per run.

Definitions (as in vLLM's and TGI's benchmarks):
- TTFT: time from sending the request to the first token event.
- ITL: each gap between two consecutive token events, pooled over all requests.
- TPOT: per request, (e2e - ttft) / (num_output_tokens - 1); requests of one token have none.
- E2E: time from sending the request to its final event.
Percentiles interpolate linearly between the two nearest ranks (numpy's default).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

PERCENTILES = (50, 90, 99)


@dataclasses.dataclass
class RequestRecord:
    """What one request did; times in seconds, `start_s` since the start of the run."""

    request_id: int
    max_new_tokens: int
    input_tokens: int | None = None
    start_s: float = 0.0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    num_output_tokens: int = 0
    error: str | None = None
    text: str | None = None  # the generated text, where the API's final event carries it (TGI)
    cached_tokens: int | None = None  # prompt tokens taken from the server's prefix cache, where reported

    @property
    def success(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "success": self.success, "tpot_s": self.tpot_s}

    def set_timings(self, start: float, token_times: Sequence[float], end: float,
                    num_reported_tokens: int | None = None) -> None:
        """Fills the latencies from clock stamps: sent, each token event, final event.

        The output length is the server's own count when it gave one (OpenAI `usage`; a
        chunk may carry several tokens), else the number of token events.
        """
        self.e2e_s = end - start
        self.num_output_tokens = num_reported_tokens or len(token_times)
        if token_times:
            self.ttft_s = token_times[0] - start
            self.itl_s = [later - earlier for earlier, later in zip(token_times, token_times[1:])]


@dataclasses.dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of one latency over a run (None when there was no sample)."""

    num_samples: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0, None, None, None, None)
        ordered = sorted(values)
        p50, p90, p99 = (percentile(ordered, q) for q in PERCENTILES)
        return cls(len(ordered), math.fsum(ordered) / len(ordered), p50, p90, p99)


@dataclasses.dataclass(frozen=True)
class Summary:
    """The figures of one run: throughputs over its wall time and the latency distributions."""

    num_requests: int
    num_failures: int
    duration_s: float
    num_output_tokens: int
    request_throughput: float
    output_token_throughput: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of sorted values, linear between the nearest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100.0
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (rank - lower)


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """Summary of a run that lasted `duration_s`; latencies count successful requests only."""
    successes = [r for r in records if r.success]
    num_output_tokens = sum(r.num_output_tokens for r in successes)
    per_second = 1.0 / duration_s if duration_s > 0 else 0.0
    return Summary(
        num_requests=len(records),
        num_failures=len(records) - len(successes),
        duration_s=duration_s,
        num_output_tokens=num_output_tokens,
        request_throughput=len(successes) * per_second,
        output_token_throughput=num_output_tokens * per_second,
        ttft_s=Distribution.of([r.ttft_s for r in successes if r.ttft_s is not None]),
        tpot_s=Distribution.of([r.tpot_s for r in successes if r.tpot_s is not None]),
        itl_s=Distribution.of([gap for r in successes for gap in r.itl_s]),
        e2e_s=Distribution.of([r.e2e_s for r in successes if r.e2e_s is not None]),
    )
