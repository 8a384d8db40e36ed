"""The figures on a known timeline: TTFT, TPOT, ITL, E2E, percentiles and throughputs by hand."""

from __future__ import annotations

import pytest

from ztgi.bench.metrics import Distribution, RequestRecord, percentile, summarize


def _record(request_id: int, start: float, token_times: list[float], end: float,
            error: str | None = None) -> RequestRecord:
    record = RequestRecord(request_id=request_id, max_new_tokens=8, error=error)
    record.set_timings(start, token_times, end)
    return record


def test_percentile_interpolates_between_nearest_ranks() -> None:
    """p50/p90/p99 of 1..4 are 2.5, 3.7, 3.97 (linear between ranks, as numpy)."""
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_record_timings_from_clock_stamps() -> None:
    """TTFT is first token minus send, ITL the gaps, TPOT (e2e - ttft) / (n - 1)."""
    record = _record(0, 10.0, [10.1, 10.15, 10.25, 10.3], 10.3)
    assert record.ttft_s == pytest.approx(0.1)
    assert record.itl_s == pytest.approx([0.05, 0.1, 0.05])
    assert record.e2e_s == pytest.approx(0.3)
    assert record.num_output_tokens == 4
    assert record.tpot_s == pytest.approx(0.2 / 3)


def test_single_token_request_has_no_tpot_and_no_itl() -> None:
    """A one-token answer has a TTFT but neither TPOT nor inter-token gaps."""
    record = _record(0, 0.0, [0.2], 0.25)
    assert record.ttft_s == pytest.approx(0.2)
    assert record.tpot_s is None and record.itl_s == []


def test_server_count_overrides_counted_events() -> None:
    """When the server reports its count (OpenAI usage), that is the output length."""
    record = RequestRecord(request_id=0, max_new_tokens=8)
    record.set_timings(0.0, [0.1, 0.2], 0.3, num_reported_tokens=5)
    assert record.num_output_tokens == 5
    assert record.tpot_s == pytest.approx(0.2 / 4)


def test_summary_of_known_timeline() -> None:
    """Two successes and one failure over 2 s: every figure as computed by hand."""
    records = [
        _record(0, 0.0, [0.1, 0.15, 0.25, 0.3], 0.3),
        _record(1, 1.0, [1.2, 1.3], 1.35),
        _record(2, 1.5, [1.6, 1.9, 2.0], 2.0, error="HTTP 500: boom"),
    ]
    summary = summarize(records, duration_s=2.0)
    assert (summary.num_requests, summary.num_failures, summary.num_output_tokens) == (3, 1, 6)
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_token_throughput == pytest.approx(3.0)
    assert summary.ttft_s == Distribution(2, pytest.approx(0.15), pytest.approx(0.15),
                                          pytest.approx(0.19), pytest.approx(0.199))
    # ITL pools the gaps of the successes: 0.05, 0.05, 0.1, 0.1
    assert summary.itl_s == Distribution(4, pytest.approx(0.075), pytest.approx(0.075),
                                         pytest.approx(0.1), pytest.approx(0.1))
    tpots = sorted([0.2 / 3, 0.15])
    assert summary.tpot_s.mean == pytest.approx(sum(tpots) / 2)
    assert summary.tpot_s.p90 == pytest.approx(tpots[0] + 0.9 * (tpots[1] - tpots[0]))
    assert summary.e2e_s.p50 == pytest.approx(0.325)


def test_summary_with_no_success_has_empty_distributions() -> None:
    """All failed: zero throughput and latency figures of None, not an exception."""
    summary = summarize([_record(0, 0.0, [], 0.1, error="refused")], duration_s=0.1)
    assert summary.num_failures == 1 and summary.request_throughput == 0.0
    assert summary.ttft_s == Distribution(0, None, None, None, None)
