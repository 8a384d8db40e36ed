"""`LLM(tensor_parallel_size=2)`: this process as rank 0 of a worker group, its other rank a real
process; greedy texts and logprobs equal the one-process engine's (float32, random Qwen2)."""

from __future__ import annotations

import pytest

from tests.worker.models.family_models import save_family_model
from ztgi import LLM, SamplingParams
from ztgi.engine_options import EngineOptions

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def test_vllms_name_selects_the_group_size() -> None:
    assert EngineOptions.parse({"tensor_parallel_size": 2}).num_shard == 2


def test_two_ranks_generate_what_one_process_does(smollm2, tmp_path) -> None:
    model = save_family_model("qwen2", str(tmp_path / "qwen2"), smollm2.path)
    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=1)
    options = dict(dtype="float32", max_model_len=512)
    alone = LLM(model, **options).generate(PROMPTS, params, use_tqdm=False)
    group = LLM(model, tensor_parallel_size=2, **options)
    try:
        grouped = group.generate(PROMPTS, params, use_tqdm=False)
    finally:
        group.close()
    for one, two in zip(alone, grouped, strict=True):
        assert two.outputs[0].token_ids == one.outputs[0].token_ids
        assert two.outputs[0].cumulative_logprob == pytest.approx(one.outputs[0].cumulative_logprob, abs=1e-3)


def test_a_rank_that_dies_fails_the_next_step_not_the_caller(smollm2, tmp_path) -> None:
    """kill -9 of rank 1: the next generate raises RuntimeError; this process lives on."""
    model = save_family_model("qwen2", str(tmp_path / "qwen2"), smollm2.path)
    group = LLM(model, tensor_parallel_size=2, dtype="float32", max_model_len=512)
    try:
        rank_1 = group._group.leader.ranks.processes[1]
        rank_1.kill()
        rank_1.wait()
        with pytest.raises(RuntimeError, match="the tensor-parallel group cannot go on"):
            group.generate(PROMPTS, SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    finally:
        group.close()


def test_a_split_the_heads_do_not_allow_is_refused_before_loading(smollm2, tmp_path) -> None:
    model = save_family_model("qwen2", str(tmp_path / "qwen2"), smollm2.path)
    with pytest.raises(ValueError, match=r"--num-shard 3 does not split this model"):
        LLM(model, tensor_parallel_size=3, dtype="float32")
