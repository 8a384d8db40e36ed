"""lm-evaluation-harness itself against a launched ztgi: its `local-completions` backend with its default
request settings (token-id prompts, `echo`, `logprobs: 1`) scores a local multiple-choice task as its
own `hf` backend does on the same float32 weights, item by item."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.e2e.server import LaunchedServer
from ztgi.common.model_source import ModelSource

TASK = "ztgi_arithmetic"
ITEMS = 24
TOLERANCE = 1e-3  # the issue's bound for float32; per-item loglikelihoods


def write_task(directory: Path) -> None:
    """A multiple-choice task of small sums, its documents a JSONL file beside its YAML (nothing downloaded)."""
    rng = random.Random(0)
    with open(directory / "items.jsonl", "w") as items:
        for _ in range(ITEMS):
            a, b = rng.randint(2, 20), rng.randint(2, 20)
            wrong = rng.sample(sorted({a + b + d for d in (-3, -2, -1, 1, 2, 3, 10)} - {a + b}), 3)
            choices = [str(n) for n in [a + b, *wrong]]
            rng.shuffle(choices)
            items.write(json.dumps({"question": f"What is {a} plus {b}?", "choices": choices,
                                    "answer": choices.index(str(a + b))}) + "\n")
    (directory / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {directory / 'items.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        "doc_to_choice: choices\n"
        "doc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n"
    )


def evaluate(model: str, model_args: dict[str, Any], task_dir: Path) -> tuple[float, dict[int, list[float]]]:
    """lm-eval's accuracy on the task, and each document's loglikelihood of each choice."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[TASK], log_samples=True,
                                      task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
                                      bootstrap_iters=0)
    assert results is not None
    scores = {sample["doc_id"]: [loglikelihood for loglikelihood, _ in sample["filtered_resps"]]
              for sample in results["samples"][TASK]}
    return results["results"][TASK]["acc,none"], scores


def picks(scores: dict[int, list[float]]) -> dict[int, int]:
    """The choice each document's likeliest answer is (what `acc` counts)."""
    return {doc_id: choices.index(max(choices)) for doc_id, choices in scores.items()}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The `hf` backend runs in this process: one intra-op thread, as a 135M model's short forwards need,
    so that neighbours busy on a small machine do not stall every kernel's barrier (ten times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_local_completions_scores_as_lm_eval_hf_backend(offline: None, one_thread: None, smollm2: ModelSource,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server adapts its threads to the machine's load, as it does by default (the suite turns that
    off for bit-exact greedy comparisons; loglikelihoods within 1e-3 do not need it)."""
    write_task(tmp_path)
    monkeypatch.setenv("ZTGI_CPU_ADAPTIVE_THREADS", "true")
    server = LaunchedServer(str(tmp_path / "run"), "--dtype", "float32", "--quantize", "none")
    try:
        served_id = server.get("/v1/models").json()["data"][0]["id"]
        served = evaluate("local-completions", {"model": served_id, "base_url": server.url + "/v1/completions",
                                                "tokenizer_backend": "huggingface", "tokenizer": smollm2.path},
                          tmp_path)
    finally:
        assert server.stop() == 0, server.log
    reference = evaluate("hf", {"pretrained": smollm2.path, "dtype": "float32", "device": "cpu"}, tmp_path)
    deltas = [abs(a - b) for doc_id, choices in reference[1].items() for a, b in zip(choices, served[1][doc_id])]
    print(f"accuracy: ztgi {served[0]:.4f}, hf {reference[0]:.4f}; max |delta loglikelihood| {max(deltas):.2e}")
    assert served[1].keys() == reference[1].keys() and len(deltas) == 4 * ITEMS
    assert max(deltas) < TOLERANCE
    assert picks(served[1]) == picks(reference[1]) and served[0] == reference[0]
