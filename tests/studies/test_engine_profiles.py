"""The engine's measuring tools: a decode step's phases and a dtype's agreement with float32."""

from __future__ import annotations

from studies.dtype_agreement import agreement, generate
from studies.step_profile import PHASES, profile_steps
from ztgi.common.messages import Generation
from ztgi.services.worker.model_loader import load_model


def generations(token_ids: list[int], logprobs: list[float]) -> list[Generation]:
    return [Generation(0, t, lp) for t, lp in zip(token_ids, logprobs)]


def test_agreement_counts_positions_before_the_first_divergence() -> None:
    """Identical requests, agreeing positions up to the first differing token, logprob diff on those only."""
    reference = [generations([1, 2, 3], [-0.1, -0.2, -0.3]), generations([4, 5, 6], [-1.0, -1.0, -1.0])]
    other = [generations([1, 2, 3], [-0.1, -0.25, -0.3]), generations([4, 9, 6], [-1.5, -9.0, -1.0])]
    result = agreement(reference, other)
    assert result["requests_identical"] == 0.5
    assert result["positions_before_divergence"] == 4 / 6
    assert abs(result["max_abs_logprob_diff"] - 0.5) < 1e-9


def test_same_dtype_agrees_fully_and_steps_split_into_phases(tiny_model_dir: str) -> None:
    """float32 against itself agrees everywhere; a profiled step reports every phase and sums them."""
    model = load_model(tiny_model_dir, "float32", "cpu", kv_cache="padded")
    prompts = [[1, 504, 3458], [1, 9690]]
    runs = [generate(model, prompts, [4, 3]) for _ in range(2)]
    result = agreement(*runs)
    assert result["requests_identical"] == 1.0 and result["max_abs_logprob_diff"] == 0.0
    profile = profile_steps(model, prompts, batch_size=3, steps=2, warmup_steps=1)
    assert all(profile[phase] >= 0 for phase in PHASES) and profile["forward"] > 0
    assert abs(profile["step"] - sum(profile[phase] for phase in PHASES)) < 1e-6
    assert profile["kv_length"] == 3 + 1 + 1 + 2  # prompt, prefill token, warmup and timed steps fed
