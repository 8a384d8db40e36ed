"""Next-token choice: each sampling parameter on known logits, seeds, and rejected values."""

from __future__ import annotations

import math

import pytest
import torch

from tests.worker.engine_helpers import alone, batch_of, request, run_to_end, step, token_ids
from ztgi.common.messages import SamplingParameters, TokenBias
from ztgi.services.worker.sampling import logits_processors as processors
from ztgi.services.worker.sampling.next_token_chooser import NextTokenChooser, validate_sampling

CPU = torch.device("cpu")
LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
PROBS = LOGITS.softmax(-1)[0]  # 0.561 0.206 0.125 0.076 0.028 0.004


def chooser(**params: object) -> NextTokenChooser:
    return NextTokenChooser.from_params([SamplingParameters(**params)], CPU)


def kept(scores: torch.Tensor) -> list[int]:
    return torch.isfinite(scores[0]).nonzero().squeeze(1).tolist()


def test_greedy_is_argmax_and_logprob_is_log_softmax():
    """Without sampling the choice is the argmax and its logprob the log-softmax of the logits."""
    next_ids, logprobs = chooser()(LOGITS.clone())
    assert next_ids.tolist() == [0]
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS, -1))


def test_logit_bias_removes_and_forces_tokens_per_row():
    """OpenAI's logit_bias: -100 takes the argmax out of the running, +100 makes token 5 the choice,
    and a row without a bias in the same batch chooses as before; the logits are not changed in place."""
    logits = LOGITS.repeat(3, 1)
    rows = NextTokenChooser.from_params([
        SamplingParameters(logit_bias=[TokenBias(0, -100.0)]), SamplingParameters(logit_bias=[TokenBias(5, 100.0)]),
        SamplingParameters()], CPU)
    next_ids, logprobs = rows(logits)
    assert next_ids.tolist() == [1, 5, 0]
    assert torch.equal(logits, LOGITS.repeat(3, 1))
    assert logprobs[1, 5] > -0.01 and torch.allclose(logprobs[2], torch.log_softmax(LOGITS[0], -1))


@pytest.mark.parametrize("bias", [TokenBias(0, 101.0), TokenBias(0, math.nan), TokenBias(-1, 1.0)])
def test_logit_bias_out_of_range_is_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        validate_sampling(SamplingParameters(logit_bias=[bias]))


def test_top_k_one_equals_greedy():
    """Sampling with top_k=1 always picks the argmax, whatever the seed."""
    for seed in range(20):
        assert chooser(do_sample=True, top_k=1, seed=seed)(LOGITS.clone())[0].tolist() == [0]


def test_top_k_keeps_the_k_best():
    """top_k=3 leaves exactly the three highest logits; top_k=0 leaves all."""
    assert kept(processors.top_k(LOGITS.clone(), torch.tensor([[3]]), 3)) == [0, 1, 2]
    both = processors.top_k(torch.cat([LOGITS, LOGITS]), torch.tensor([[3], [0]]), 3)
    assert kept(both[1:]) == [0, 1, 2, 3, 4, 5]


def test_top_p_keeps_the_smallest_set_reaching_p():
    """top_p keeps the fewest most-likely tokens whose mass reaches p (0.561 + 0.206 = 0.767)."""
    assert kept(processors.top_p(LOGITS.clone(), torch.tensor([[0.5]]))) == [0]
    assert kept(processors.top_p(LOGITS.clone(), torch.tensor([[0.76]]))) == [0, 1]
    assert kept(processors.top_p(LOGITS.clone(), torch.tensor([[0.77]]))) == [0, 1, 2]
    assert kept(processors.top_p(LOGITS.clone(), torch.tensor([[1.0]]))) == [0, 1, 2, 3, 4, 5]


def test_typical_p_keeps_the_tokens_closest_to_the_entropy():
    """typical_p keeps tokens by |surprise - entropy|, most typical first, until their mass reaches p."""
    entropy = -(PROBS * PROBS.log()).sum()
    order = torch.argsort((-PROBS.log() - entropy).abs()).tolist()
    first_mass = PROBS[order[0]].item()
    assert kept(processors.typical_p(LOGITS.clone(), torch.tensor([[first_mass * 0.9]]))) == [order[0]]
    two = sorted(order[:2])
    mass_two = PROBS[order[:2]].sum().item()
    assert kept(processors.typical_p(LOGITS.clone(), torch.tensor([[mass_two * 0.99]]))) == two
    assert len(kept(processors.typical_p(LOGITS.clone(), torch.tensor([[1.0]])))) == 6


def test_temperature_scales_logits():
    """Temperature divides the logits: the reported logprobs are those of logits / T."""
    _, logprobs = chooser(do_sample=True, temperature=0.5, seed=1)(LOGITS.clone())
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS / 0.5, -1))
    _, greedy = chooser(temperature=0.0)(LOGITS.clone())  # greedy: a temperature of 0 is ignored
    assert torch.allclose(greedy, torch.log_softmax(LOGITS, -1))


def test_repetition_penalty_lowers_tokens_already_present():
    """Tokens in the sequence are penalised (positive logits divided, negative multiplied); others untouched."""
    history = torch.tensor([[0, 4, 4, 2]])
    mask = torch.tensor([[0, 1, 1, 1]])  # the first column is padding: token 0 is not present
    scores = chooser(repetition_penalty=2.0).process(LOGITS.clone(), history, mask)
    assert scores[0].tolist() == pytest.approx([2.0, 1.0, 0.25, 0.0, -2.0, -3.0])


def test_repetition_penalty_changes_greedy_choice():
    """A strong repetition penalty moves greedy decoding off a token it already produced."""
    history, mask = torch.tensor([[0]]), torch.tensor([[1]])
    assert chooser(repetition_penalty=1.5)(LOGITS.clone(), history, mask)[0].tolist() == [0]
    assert chooser(repetition_penalty=3.0)(LOGITS.clone(), history, mask)[0].tolist() == [1]


def test_frequency_penalty_subtracts_normalised_counts():
    """TGI's frequency penalty: logit -= penalty x count / sequence length; negative values favour repeats."""
    history = torch.tensor([[1, 1, 1, 3]])
    mask = torch.ones_like(history)
    scores = chooser(frequency_penalty=2.0).process(LOGITS.clone(), history, mask)
    assert scores[0].tolist() == pytest.approx([2.0, 1.0 - 1.5, 0.5, -0.5, -1.0, -3.0])
    boosted = chooser(frequency_penalty=-2.0).process(LOGITS.clone(), history, mask)
    assert boosted[0, 1].item() == pytest.approx(2.5)


def test_presence_penalty_subtracts_the_penalty_once_per_present_token():
    """OpenAI's presence penalty: logit -= penalty for every token present, however often; padding adds nothing."""
    history = torch.tensor([[0, 1, 1, 1, 3]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])  # the first column is padding: token 0 is not present
    scores = chooser(presence_penalty=0.75).process(LOGITS.clone(), history, mask)
    assert scores[0].tolist() == pytest.approx([2.0, 1.0 - 0.75, 0.5, -0.75, -1.0, -3.0])
    boosted = chooser(presence_penalty=-2.0).process(LOGITS.clone(), history, mask)
    assert boosted[0].tolist() == pytest.approx([2.0, 3.0, 0.5, 2.0, -1.0, -3.0])


def test_presence_penalty_in_a_mixed_batch_changes_only_its_row():
    """A batch mixing a neutral row and a presence-penalised row: the neutral row comes out unchanged."""
    params = [SamplingParameters(), SamplingParameters(presence_penalty=1.5), SamplingParameters(frequency_penalty=2.0)]
    batch_chooser = NextTokenChooser.from_params(params, CPU)
    assert batch_chooser.needs_token_counts
    history = torch.tensor([[1, 1, 1, 3]] * 3)
    scores = batch_chooser.process(torch.cat([LOGITS] * 3), history, torch.ones_like(history))
    assert scores[0].tolist() == pytest.approx(LOGITS[0].tolist())
    assert scores[1].tolist() == pytest.approx([2.0, 1.0 - 1.5, 0.5, -1.5, -1.0, -3.0])
    assert scores[2].tolist() == pytest.approx([2.0, 1.0 - 1.5, 0.5, -0.5, -1.0, -3.0])


def test_presence_penalty_changes_greedy_choice():
    """A presence penalty larger than the gap to the runner-up moves greedy decoding off a present token."""
    history, mask = torch.tensor([[0]]), torch.tensor([[1]])
    assert chooser(presence_penalty=0.9)(LOGITS.clone(), history, mask)[0].tolist() == [0]
    assert chooser(presence_penalty=1.1)(LOGITS.clone(), history, mask)[0].tolist() == [1]
    assert not chooser().needs_token_counts  # a neutral request costs no counting


def test_processors_are_per_row():
    """One batch mixing neutral and non-neutral rows changes only the rows that asked."""
    params = [SamplingParameters(), SamplingParameters(do_sample=True, top_k=2, seed=3)]
    scores = NextTokenChooser.from_params(params, CPU).process(torch.cat([LOGITS, LOGITS]), None, None)
    assert kept(scores[:1]) == [0, 1, 2, 3, 4, 5] and kept(scores[1:]) == [0, 1]


def test_seeded_sampling_follows_the_distribution():
    """Sampling with temperature 1 draws tokens about as often as their probability."""
    counts = torch.zeros(6)
    for seed in range(600):
        counts[chooser(do_sample=True, seed=seed)(LOGITS.clone())[0]] += 1
    assert torch.allclose(counts / 600, PROBS, atol=0.06)


def sampling_requests(seed_of: dict[int, int]) -> list:
    prompts = {1: [1, 504, 3458, 282], 2: [1, 9690, 30, 44, 12], 3: [1, 2683, 253]}
    return [request(rid, prompts[rid], 10, ignore_eos=True, do_sample=True, seed=seed_of[rid], top_k=50)
            for rid in prompts]


def test_seeded_sampling_is_reproducible_across_batch_compositions(tiny_each_layout):
    """A seeded request draws the same tokens alone, in one batch, and across concatenate and filter."""
    reqs = sampling_requests({1: 11, 2: 22, 3: 33})
    want = alone(tiny_each_layout, reqs)
    assert token_ids(run_to_end(tiny_each_layout, batch_of(tiny_each_layout, reqs))) == want
    into: dict = {}
    first = step(tiny_each_layout, step(tiny_each_layout, batch_of(tiny_each_layout, reqs[:1], 1), into), into)
    merged = type(first).concatenate([first, step(tiny_each_layout, batch_of(tiny_each_layout, reqs[1:], 2), into)])
    merged = step(tiny_each_layout, merged, into).filter([3, 1])
    got = token_ids(run_to_end(tiny_each_layout, merged, into))
    assert got[1] == want[1] and got[3] == want[3]
    assert all(g.seed == 11 for g in into[1])


def test_different_seeds_give_different_tokens(tiny_each_layout):
    """The same prompt with another seed draws other tokens; greedy requests report no seed."""
    a = alone(tiny_each_layout, sampling_requests({1: 1, 2: 2, 3: 3}))
    b = alone(tiny_each_layout, sampling_requests({1: 4, 2: 5, 3: 6}))
    assert all(a[rid] != b[rid] for rid in a)
    greedy = run_to_end(tiny_each_layout, batch_of(tiny_each_layout, [request(9, [1, 2, 3], 2)]))
    assert all(g.seed is None for g in greedy[9])


@pytest.mark.parametrize("field, value", [
    ("temperature", 0.0), ("temperature", -1.0), ("temperature", math.nan), ("top_k", -1),
    ("top_p", 0.0), ("top_p", 1.5), ("typical_p", 0.0), ("typical_p", 1.01), ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0), ("frequency_penalty", 2.5), ("frequency_penalty", -3.0),
    ("presence_penalty", 2.5), ("presence_penalty", -3.0), ("presence_penalty", math.nan), ("seed", -1),
])
def test_invalid_values_are_rejected_naming_the_field(field, value):
    """An out-of-range sampling value is a ValueError whose message names the field."""
    with pytest.raises(ValueError, match=f"`{field}`"):
        validate_sampling(SamplingParameters(do_sample=True, **{field: value}))


def test_invalid_value_in_a_batch_names_the_request(tiny_each_layout):
    """from_requests refuses a batch with one bad request, naming that request and the field."""
    reqs = [request(1, [1, 2]), request(2, [1, 2], do_sample=True, top_p=2.0)]
    with pytest.raises(ValueError, match=r"request 2: `top_p`"):
        batch_of(tiny_each_layout, reqs)
