"""What a step reports: stopping (EOS, length, ignore_eos), counts, top tokens and prefill logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_to_end, step


@pytest.fixture(scope="module")
def chat_prompt(smollm2) -> list[int]:
    """A question SmolLM2 answers in a few tokens, then ends with <|im_end|>."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_eos_length_and_ignore_eos(smollm2_each_layout, chat_prompt):
    """EOS ends a request with `eos_token`; ignore_eos runs it on to max_new_tokens with `length`;
    generated_tokens counts every token so far."""
    eos = smollm2_each_layout.eos_token_ids
    got = run_to_end(smollm2_each_layout, batch_of(smollm2_each_layout, [
        request(1, chat_prompt, 24), request(2, chat_prompt, 24, ignore_eos=True), request(3, chat_prompt, 3)]))
    stopped = got[1]
    assert stopped[-1].finish_reason == "eos_token" and stopped[-1].token_id in eos and len(stopped) < 24
    assert all(g.finish_reason is None for g in stopped[:-1])
    assert [g.generated_tokens for g in stopped] == list(range(1, len(stopped) + 1))
    ignored = got[2]
    assert len(ignored) == 24 and ignored[-1].finish_reason == "length"
    assert [g.token_id for g in ignored[:len(stopped)]] == [g.token_id for g in stopped]
    assert [g.finish_reason for g in got[3]] == [None, None, "length"]


def test_finished_request_never_generates_again(tiny_each_layout):
    """A request that finished stays in the batch until Filter, but a later step gives it no Generation;
    the step that finishes the last request returns no batch."""
    batch = batch_of(tiny_each_layout, [request(1, [1, 2, 3], 2, ignore_eos=True),
                                        request(2, [4, 5], 5, ignore_eos=True)])
    seen: dict = {}
    batch = step(tiny_each_layout, step(tiny_each_layout, batch, seen), seen)
    assert seen[1][-1].finish_reason == "length" and batch.seq_ids == [1, 2]
    for _ in range(2):  # Decode before the scheduler's Filter arrives
        batch = step(tiny_each_layout, batch, seen)
    assert len(seen[1]) == 2 and len(seen[2]) == 4
    assert step(tiny_each_layout, batch, seen) is None and seen[2][-1].finish_reason == "length"


def test_top_n_tokens(tiny_each_layout):
    """top_n_tokens gives the n best ids, best first, with logprobs matching the chosen token's
    distribution; requests that ask for none get none."""
    got = run_to_end(tiny_each_layout, batch_of(tiny_each_layout, [
        request(1, [1, 2, 3], 3, top_n_tokens=4), request(2, [7, 8], 3), request(3, [9], 3, top_n_tokens=1)]))
    for generation in got[1]:
        assert len(generation.top_ids) == 4 == len(generation.top_logprobs)
        assert generation.top_logprobs == sorted(generation.top_logprobs, reverse=True)
        assert generation.top_ids[0] == generation.token_id  # greedy: the best one is the chosen one
        assert generation.top_logprobs[0] == pytest.approx(generation.logprob)
    assert all(g.top_ids == [] and g.top_logprobs == [] for g in got[2])
    assert all(len(g.top_ids) == 1 and g.top_ids[0] == g.token_id for g in got[3])


def test_top_n_tokens_include_ties():
    """As in TGI, tokens tied with the n-th best come along (and -inf tokens never do)."""
    from ztgi.services.worker.sampling.top_tokens import top_tokens
    logprobs = torch.tensor([[-1.0, -2.0, -2.0, -3.0, -math.inf], [-0.5, -1.0, -math.inf, -math.inf, -math.inf]])
    ids, values, counts = top_tokens(logprobs, [2, 4])
    assert counts.tolist() == [3, 2]
    assert sorted(ids[0, :3].tolist()) == [0, 1, 2] and ids[1, :2].tolist() == [0, 1]


def test_prefill_logprobs_equal_log_softmax_of_a_plain_forward(tiny_each_layout, tiny_reference):
    """prefill_logprobs: NaN for the first prompt token, then log_softmax(plain forward) of each next
    prompt token, for left-padded rows too; only on the first Generation, only when asked."""
    prompts = {1: [1, 504, 3458, 282, 4649], 2: [9690, 30]}
    got = run_to_end(tiny_each_layout, batch_of(tiny_each_layout, [
        request(1, prompts[1], 2, prefill_logprobs=True), request(2, prompts[2], 2, prefill_logprobs=True),
        request(3, [5, 6, 7], 2)]))
    for rid, ids in prompts.items():
        with torch.inference_mode():
            logits = tiny_reference(torch.tensor([ids])).logits[0]
        want = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
        first = got[rid][0]
        assert first.prefill_ids == ids
        assert math.isnan(first.prefill_logprobs[0])
        assert first.prefill_logprobs[1:] == pytest.approx(want.tolist(), abs=1e-4)
        assert got[rid][1].prefill_logprobs is None and got[rid][1].prefill_ids is None
    assert got[3][0].prefill_logprobs is None


def test_prefill_top_tokens_are_each_prompt_positions_best(tiny_each_layout, tiny_reference):
    """With prefill logprobs and top_n_tokens, each prompt position after the first reports its
    n likeliest tokens (best first, from the plain forward's log_softmax), with the first token only."""
    ids = [1, 504, 3458, 282, 4649]
    got = run_to_end(tiny_each_layout, batch_of(tiny_each_layout, [
        request(1, ids, 2, prefill_logprobs=True, top_n_tokens=2), request(2, [9690, 30], 2, prefill_logprobs=True)]))
    with torch.inference_mode():
        logprobs = torch.log_softmax(tiny_reference(torch.tensor([ids])).logits[0], -1)[:-1]
    best = torch.topk(logprobs, 2, dim=-1)
    first = got[1][0]
    assert first.prefill_top_ids[0] == [] and first.prefill_top_logprobs[0] == []
    assert [row[:2] for row in first.prefill_top_ids[1:]] == best.indices.tolist()
    for row, want in zip(first.prefill_top_logprobs[1:], best.values.tolist()):
        assert row[:2] == pytest.approx(want, abs=1e-4)
    assert got[1][1].prefill_top_ids is None
    assert got[2][0].prefill_top_ids is None  # prefill logprobs without top_n_tokens
