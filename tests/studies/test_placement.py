"""`python -m studies.placement`: its two-document workload, its medians, and a short run of the
tool on the tiny model (two launched servers of two workers each)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from studies.placement import medians
from studies.prefix_datasets import two_documents


def test_two_documents_interleave_questions_on_two_documents() -> None:
    alternate = two_documents(random.Random(1), 8, "alternate", 50)
    assert [d for d, _ in alternate] == [0, 1] * 4
    drawn = two_documents(random.Random(1), 40, "random", 50)
    assert {d for d, _ in drawn} == {0, 1} and [d for d, _ in drawn] != [0, 1] * 20
    for requests in (alternate, drawn):
        documents = {d: prompt.split("\n\nQuestion")[0] for d, prompt in requests}
        assert documents[0] != documents[1]
        assert all(prompt.startswith(documents[d]) for d, prompt in requests)
        assert len({prompt for _, prompt in requests}) == len(requests)


def test_medians_per_policy_and_ratios_per_round() -> None:
    def row(policy: str, tok_s: float, duration: float) -> dict:
        return {"pattern": "random", "placement": policy, "on_holder": 1.0, "computed_tokens": 10,
                "output_tok_s": tok_s, "ttft_p50_s": 0.1, "duration_s": duration}

    rows = [row("cache-aware", 12.0, 10.0), row("round-robin", 10.0, 12.0),
            row("round-robin", 8.0, 15.0), row("cache-aware", 8.0, 15.0),
            row("cache-aware", 11.0, 11.0), row("round-robin", 11.0, 11.0)]
    aware, round_robin, ratios = medians(rows)
    assert aware["output_tok_s"] == 11.0 and round_robin["output_tok_s"] == 10.0 and aware["rounds"] == 3
    assert ratios["output_tok_s"] == [1.2, 1.0, 1.0] and ratios["duration_s"] == [0.833, 1.0, 1.0]


@pytest.mark.slow
def test_a_short_run_places_every_request_on_its_documents_holder(tiny_model_dir: str) -> None:
    """8 questions on two documents in random order, 4 at a time, against both policies: every run
    finishes without failure, and cache-aware puts each one some worker holds on a holder."""
    finished = subprocess.run(
        [sys.executable, "-m", "studies.placement", "--requests", "8", "--rounds", "1", "--patterns", "random",
         "--document-words", "120", "--tokens", "2", "--flags", f"--model-id {tiny_model_dir} --dtype float32"],
        check=False, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    lines = [json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")]
    runs = {line["placement"]: line for line in lines if "round" in line}
    assert set(runs) == {"cache-aware", "round-robin"} and all(r["failures"] == 0 for r in runs.values())
    aware = runs["cache-aware"]
    assert aware["on_holder"] == 1.0 and aware["holder"] + aware["no_holder"] == 8
    assert lines[-1]["ratio"] == "cache-aware / round-robin"
