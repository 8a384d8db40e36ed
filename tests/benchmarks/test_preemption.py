"""`python -m benchmarks.preemption` on the tiny model: a pool of a few blocks preempts, and every
text still equals the unconstrained run's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.preemption import compare_runs, prompts


def test_prompts_are_distinct() -> None:
    texts = prompts(64)
    assert len(set(texts)) == 64


def test_a_failed_or_differing_text_or_no_preemption_fails_the_claim() -> None:
    large = {"texts": ["a", "b", "c"], "preemptions": 0}
    assert compare_runs(large, {"texts": ["a", "b", "c"], "preemptions": 2})["claim_met"]
    assert compare_runs(large, {"texts": ["a", "x", "c"], "preemptions": 2})["texts_differ"] == [1]
    assert compare_runs(large, {"texts": ["a", None, "c"], "preemptions": 2})["failures"] == 1
    assert not compare_runs(large, {"texts": ["a", "b", "c"], "preemptions": 0})["claim_met"]


@pytest.mark.slow
def test_small_pool_preempts_and_every_text_equals_the_unconstrained_run(tiny_model_dir: str, tmp_path) -> None:
    """16 requests of ~60 tokens each against a pool of 8 blocks of 16: preemptions, no failure, equal texts."""
    output = tmp_path / "preemption.json"
    finished = subprocess.run(
        [sys.executable, "-m", "benchmarks.preemption", "--requests", "16", "--max-new-tokens", "24",
         "--max-total-tokens", "128", "--small-pool-tokens", "128", "--large-budget-mb", "16",
         "--output", str(output), "--", "--model-id", tiny_model_dir, "--dtype", "float32"],
        check=False, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["small_preemptions"] > 0 and report["large_preemptions"] == 0
    assert report["failures"] == 0 and report["texts_differ"] == []
    assert report["small_texts"] == report["large_texts"] and all(report["small_texts"])
