"""`python -m studies.preemption` on the tiny model: a pool of a few blocks preempts, and every
text still equals the unconstrained run's (up to a float near-tie)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from studies.preemption import compare_runs, prompts
from ztgi.bench.greedy_parity import GreedyStream


def test_prompts_are_distinct() -> None:
    texts = prompts(64)
    assert len(set(texts)) == 64


def _streams(*firsts: int | None) -> list[GreedyStream | None]:
    """One-token streams whose token 1 had runner-up 2 at a near-tie and token 3 runner-up 4 far behind."""
    tops = {1: [(1, -0.6930), (2, -0.6935)], 2: [(2, -0.6930), (1, -0.6935)], 3: [(3, -0.1), (4, -3.0)],
            4: [(4, -0.1), (3, -3.0)]}
    return [None if first is None else GreedyStream([first], [str(first)], [tops[first]]) for first in firsts]


def test_a_failed_or_differing_text_or_no_preemption_fails_the_claim() -> None:
    large = {"texts": _streams(1, 3, 3), "preemptions": 0}
    assert compare_runs(large, {"texts": _streams(1, 3, 3), "preemptions": 2})["claim_met"]
    assert compare_runs(large, {"texts": _streams(1, 4, 3), "preemptions": 2})["texts_differ"] == [1]
    parted = compare_runs(large, {"texts": _streams(2, 3, 3), "preemptions": 2})
    assert parted["parted_at_near_tie"] == [0] and parted["claim_met"]
    assert compare_runs(large, {"texts": _streams(1, None, 3), "preemptions": 2})["failures"] == 1
    assert not compare_runs(large, {"texts": _streams(1, 3, 3), "preemptions": 0})["claim_met"]


@pytest.mark.slow
def test_small_pool_preempts_and_every_text_equals_the_unconstrained_run(tiny_model_dir: str, tmp_path) -> None:
    """16 requests of ~60 tokens each against a pool of 8 blocks of 16: preemptions, no failure, equal texts."""
    output = tmp_path / "preemption.json"
    finished = subprocess.run(
        [sys.executable, "-m", "studies.preemption", "--requests", "16", "--max-new-tokens", "24",
         "--max-total-tokens", "128", "--small-pool-tokens", "128", "--large-budget-mb", "16",
         "--output", str(output), "--", "--model-id", tiny_model_dir, "--dtype", "float32"],
        check=False, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["small_preemptions"] > 0 and report["large_preemptions"] == 0
    assert report["failures"] == 0 and report["texts_differ"] == [] and all(report["small_texts"])
    equal = [i for i in range(16) if i not in report["parted_at_near_tie"]]
    assert [report["small_texts"][i] for i in equal] == [report["large_texts"][i] for i in equal]
