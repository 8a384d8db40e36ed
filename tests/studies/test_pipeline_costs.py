"""The pipeline-costs split on /metrics pages rendered by prometheus_client from known observations."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from studies.pipeline_costs import _service_of, cpu_used, mean_ms, parse_totals, render, step_costs


class StepHistograms:
    """The scheduler's step histograms, under their /metrics names, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.by_name = {name: Histogram(name, name, labels, registry=self.registry) for name, labels in (
            ("tgi_batch_inference_duration", ["method"]), ("tgi_batch_forward_duration", ["method"]),
            ("tgi_batch_decode_duration", ["method"]), ("tgi_batch_concat_duration", []))}

    def step(self, method: str, round_trip_s: float, forward_s: float, choose_s: float, concat_s: float) -> None:
        for name, seconds in (("tgi_batch_inference_duration", round_trip_s),
                              ("tgi_batch_forward_duration", forward_s), ("tgi_batch_decode_duration", choose_s)):
            self.by_name[name].labels(method=method).observe(seconds)
        if method == "decode":
            self.by_name["tgi_batch_concat_duration"].observe(concat_s)

    def page(self):
        return parse_totals(generate_latest(self.registry).decode())


def test_only_the_steps_between_the_pages_count() -> None:
    """Two decode steps before the first page are left out; the two after give the means."""
    histograms = StepHistograms()
    histograms.step("decode", 1.0, 0.9, 0.05, 0.01)
    histograms.step("decode", 1.0, 0.9, 0.05, 0.01)
    before = histograms.page()
    histograms.step("decode", 0.050, 0.040, 0.002, 0.001)
    histograms.step("decode", 0.070, 0.060, 0.002, 0.001)
    after = histograms.page()
    assert mean_ms(before, after, "tgi_batch_inference_duration", {"method": "decode"}) == (2, pytest.approx(60.0))
    costs = step_costs(before, after, "decode")
    assert costs.num_steps == 2
    assert costs.parts_ms == pytest.approx({"forward": 50.0, "choose": 2.0, "concatenate": 1.0})
    assert costs.between_steps_ms == pytest.approx(7.0)


def test_a_method_that_did_not_run_has_no_costs() -> None:
    histograms = StepHistograms()
    histograms.step("decode", 0.05, 0.04, 0.002, 0.001)
    page = histograms.page()
    assert step_costs(page, page, "decode") is None
    assert step_costs({}, page, "prefill") is None
    assert mean_ms({}, page, "tgi_batch_concat_duration", {}) == (1, pytest.approx(1.0))


def test_prefill_has_no_concatenate_part() -> None:
    histograms = StepHistograms()
    before = histograms.page()
    histograms.step("prefill", 0.100, 0.090, 0.004, 0.0)
    costs = step_costs(before, histograms.page(), "prefill")
    assert costs.parts_ms == pytest.approx({"forward": 90.0, "choose": 4.0})
    assert costs.between_steps_ms == pytest.approx(6.0)


def test_services_are_found_by_their_module() -> None:
    assert _service_of([b"/venv/bin/python3", b"-m", b"ztgi.services.worker", b"--worker-index", b"0"]) == "worker"
    assert _service_of([b"python", b"-m", b"ztgi.services.launcher"]) is None  # not a pipeline service
    assert _service_of([b"python", b"ztgi.services.worker"]) is None
    assert _service_of([b""]) is None


def test_cpu_counts_processes_seen_at_both_snapshots() -> None:
    """Two tokenizers add up; a process that started in between is left out (its total is not a delta)."""
    before = {1: ("tokenizer", 10.0), 2: ("tokenizer", 5.0), 3: ("worker", 100.0)}
    after = {1: ("tokenizer", 10.5), 2: ("tokenizer", 5.25), 3: ("worker", 130.0), 4: ("gateway", 2.0)}
    assert cpu_used(before, after) == pytest.approx({"tokenizer": 0.75, "worker": 30.0})


def test_report_lines() -> None:
    histograms = StepHistograms()
    before = histograms.page()
    histograms.step("decode", 0.050, 0.040, 0.002, 0.001)
    text = render([step_costs(before, histograms.page(), "decode")], (3, 2.5), {"scheduler": 0.5}, 100, 5.0, 20.0)
    assert text.splitlines()[0] == "100 output tokens in 5.0 s (20.0 tok/s)"
    assert "decode        1       50.00        40.00         2.00         1.00    7.00 (14.0%)" in text
    assert "filter        3        2.50  (round trip)" in text
    assert "scheduler     0.5     5.00" in text
    assert "filter" not in render([], (0, None), {}, 0, 1.0, 0.0)
