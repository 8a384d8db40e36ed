"""Speculative decoding in the paged engine: prompt lookup, verification in the step, acceptance."""

from __future__ import annotations

import pytest

from tests.worker.conftest import TEST_POOL_BLOCKS
from tests.worker.engine_helpers import batch_of, request
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.paged.prompt_lookup import PromptLookup

CODE = ("def add(a, b):\n    return a + b\n\ndef multiply(a, b):\n    return a * b\n\n"
        "def subtract(a, b):\n    return a - b\n")


@pytest.fixture(scope="module")
def speculating_model(smollm2):
    """SmolLM2 in float32 on the paged KV cache with --speculate 4."""
    model = load_model(smollm2.path, dtype="float32", device="cpu", kv_cache="paged", speculate=4)
    model.allocate_pool(TEST_POOL_BLOCKS)
    return model


@pytest.fixture(scope="module")
def chat_ids(smollm2):
    """A chat prompt's ids (SmolLM2's template), by the user's text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)

    def encode(text: str) -> list[int]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False)
        return tokenizer(prompt)["input_ids"]
    return encode


def run(model, requests) -> tuple[dict, int, int, int]:
    """Steps the batch to its end: request id -> generations, and the steps, proposed and accepted tokens."""
    batch, into, num_steps, num_proposed, num_accepted = batch_of(model, requests), {}, 0, 0, 0
    while batch is not None:
        generations, batch, timings = model.generate_token(batch)
        for generation in generations:
            into.setdefault(generation.seq_id, []).append(generation)
        num_steps += 1
        num_proposed += timings.num_proposed
        num_accepted += timings.num_accepted
    return into, num_steps, num_proposed, num_accepted


def same_generations(got: dict, expected: dict) -> None:
    """Token for token the same ids, finish reasons, counts, top tokens; logprobs to float tolerance."""
    assert got.keys() == expected.keys()
    for rid, generations in expected.items():
        assert [g.token_id for g in got[rid]] == [g.token_id for g in generations], rid
        assert [g.finish_reason for g in got[rid]] == [g.finish_reason for g in generations], rid
        assert [g.generated_tokens for g in got[rid]] == list(range(1, len(generations) + 1))
        assert [g.top_ids for g in got[rid]] == [g.top_ids for g in generations], rid
        assert [g.logprob for g in got[rid]] == pytest.approx([g.logprob for g in generations], abs=1e-3)


def test_prompt_lookup_proposes_what_followed_the_longest_suffix() -> None:
    """The tokens after the latest earlier occurrence of the longest suffix (up to 3 tokens) are proposed."""
    assert PromptLookup().propose([1, 2, 3, 4, 9, 1, 2, 3], 2) == [4, 9]
    assert PromptLookup().propose([5, 3, 7, 1, 3, 8, 2, 1, 3], 3) == [8, 2, 1]  # (1, 3) beats the later (3,)
    assert PromptLookup().propose([4, 6, 4, 7, 4], 5) == [7, 4]  # the latest occurrence, cut at the end
    assert PromptLookup().propose([1, 2, 3], 4) == []
    assert PromptLookup().propose([1, 2, 1], 0) == []


def test_prompt_lookup_indexes_tokens_as_they_come() -> None:
    """One index serves a growing sequence: new tokens are found on the next proposal."""
    lookup, tokens = PromptLookup(), [10, 11, 12]
    assert lookup.propose(tokens, 2) == []
    tokens += [10, 11]
    assert lookup.propose(tokens, 2) == [12, 10]
    tokens += [13, 10, 11]
    assert lookup.propose(tokens, 2) == [13, 10]


def test_greedy_tokens_equal_without_speculation(speculating_model, smollm2_paged_model, chat_ids) -> None:
    """Greedy requests batched together get the same tokens, logprobs and top tokens with --speculate 4,
    in fewer steps: a copy task, an open question, and one whose max_new_tokens ends inside a run."""
    requests = [request(1, chat_ids("Rename the functions with the prefix `op_` and repeat the code:\n" + CODE), 48,
                        top_n_tokens=2),
                request(2, chat_ids("What is the capital of France?"), 24),
                request(3, chat_ids("Repeat this code exactly:\n" + CODE), 11, ignore_eos=True)]
    expected, plain_steps, _, _ = run(smollm2_paged_model, requests)
    got, steps, num_proposed, num_accepted = run(speculating_model, requests)
    same_generations(got, expected)
    assert got[3][-1].finish_reason == "length" and len(got[3]) == 11
    assert 0 < num_accepted <= num_proposed and steps < plain_steps


def test_eos_inside_an_accepted_run_ends_the_request(speculating_model, smollm2_paged_model, chat_ids) -> None:
    """A proposal that runs past the end of the answer (the chat template's end of turn and what
    follows it in the prompt) is cut at the EOS token: nothing after it is generated."""
    requests = [request(1, chat_ids("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog."), 30)]
    expected, _, _, _ = run(smollm2_paged_model, requests)
    got, _, _, num_accepted = run(speculating_model, requests)
    same_generations(got, expected)
    assert got[1][-1].finish_reason == "eos_token" and num_accepted > 0


def test_seeded_sampling_equals_without_speculation(speculating_model, smollm2_paged_model, chat_ids) -> None:
    """A seeded sampling request draws the same tokens with and without speculation (its generator is
    left where one step at a time leaves it), penalties and top-p applied per position."""
    requests = [request(i, chat_ids("Repeat this code exactly:\n" + CODE), 40, do_sample=True, seed=seed,
                        temperature=0.7, top_p=0.9, repetition_penalty=1.05)
                for i, seed in ((1, 3), (2, 11))]
    expected, _, _, _ = run(smollm2_paged_model, requests)
    got, _, _, num_accepted = run(speculating_model, requests)
    same_generations(got, expected)
    assert num_accepted > 0


def test_grammar_requests_do_not_speculate(speculating_model, chat_ids) -> None:
    """A grammar-constrained request gets no proposals (its grammar state takes one token a step)."""
    from ztgi.common.messages import Grammar

    grammar = Grammar("regex", "(def add\\(a, b\\):\n    return a \\+ b\n){2}")
    _, _, num_proposed, _ = run(speculating_model, [request(1, chat_ids("Repeat twice:\n" + CODE), 30,
                                                            grammar=grammar)])
    assert num_proposed == 0


def test_rejection_sampling_keeps_the_target_distribution(tiny_paged_model) -> None:
    """1200 seeded requests verify a proposed token x after their first one: x is accepted with
    probability p(x), and the token chosen at that position follows p (x or, on rejection, p without
    x renormalised), within 4 standard deviations; an accepted x brings the next position's token too."""
    import time

    import torch

    from ztgi.services.worker.paged.model import PagedModel

    model = PagedModel(tiny_paged_model.loaded, tiny_paged_model.block_size, speculate=4)
    model.allocate_pool(4096)
    prompt, sampling = [5, 6, 7, 8, 9, 10], dict(do_sample=True, temperature=1.0, top_k=3)
    batch = batch_of(model, [request(seed + 1, prompt, 3, ignore_eos=True, seed=seed, **sampling)
                             for seed in range(1200)])
    model.generate_token(batch)  # the prefill: each request samples its first token
    targets = {}  # first token -> (the processed distribution after it, the proposal: its second best)
    for first in {s.tokens[-1] for s in batch.sequences}:
        logits = tiny_paged_model.loaded.module(torch.tensor([prompt + [first]])).logits[0, -1]
        probs = torch.softmax(batch.chooser.select([0]).process(logits[None], None, None), -1)[0]
        targets[first] = (probs, int(probs.topk(2).indices[1]))
    for sequence in batch.sequences:
        sequence.draft = [targets[sequence.tokens[-1]][1]]
    generations, _, _ = model.step(batch, time.perf_counter_ns())
    by_request: dict = {}
    for generation in generations:
        by_request.setdefault(generation.seq_id, []).append(generation.token_id)
    for first, (probs, proposal) in targets.items():
        rows = [by_request[s.seq_id] for s in batch.sequences if s.tokens[len(prompt)] == first]
        num = len(rows)
        assert num >= 100 and 0.05 < probs[proposal] < 0.95  # enough draws, and a proposal both accepted and not
        for token in probs.nonzero().flatten().tolist():
            p = probs[token].item()
            seen = sum(row[0] == token for row in rows)
            assert abs(seen - p * num) <= 4 * (num * p * (1 - p)) ** 0.5 + 1, (first, token, seen, p, num)
        assert all(len(row) == (2 if row[0] == proposal else 1) for row in rows)


def test_large_batches_propose_nothing(tiny_paged_model) -> None:
    """Back-off: a step with more decoding sequences than MAX_SPECULATING_ROWS proposes nothing, a
    small one proposes for every sequence whose suffix occurred before, within MAX_PROPOSED_TOKENS."""
    from ztgi.services.worker.paged.model import PagedModel
    from ztgi.services.worker.paged.speculator import MAX_PROPOSED_TOKENS, MAX_SPECULATING_ROWS

    model = PagedModel(tiny_paged_model.loaded, tiny_paged_model.block_size, speculate=4)
    model.allocate_pool(1024)
    prompt = [5, 6, 7, 8] * 3
    for size, proposes in ((MAX_SPECULATING_ROWS + 1, False), (MAX_SPECULATING_ROWS, True)):
        batch = batch_of(model, [request(i + 1, prompt, 8, ignore_eos=True) for i in range(size)])
        model.generate_token(batch)  # the prefill
        for sequence in batch.sequences:
            sequence.tokens[-1] = 8  # a token met before in every sequence: what followed it is proposed
        model.speculator.propose(batch)
        drafts = [sequence.draft for sequence in batch.sequences]
        assert all(drafts) == proposes and any(drafts) == proposes
        assert sum(map(len, drafts)) <= MAX_PROPOSED_TOKENS


def test_speculate_is_checked(tiny_model_dir) -> None:
    """--speculate out of range, or on the padded KV cache, is refused with a message naming it."""
    from ztgi.common.config import ConfigError
    from ztgi.services.scheduler.config import SchedulerConfig
    from ztgi.services.worker.config import WorkerConfig

    for config in (WorkerConfig, SchedulerConfig):
        with pytest.raises(ConfigError, match="--speculate"):
            config(speculate=17)
    with pytest.raises(ValueError, match="--speculate 2 needs the paged KV cache"):
        load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="padded", speculate=2)
