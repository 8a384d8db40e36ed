"""Greedy generation through the engine equals transformers' own `generate` for SmolLM2."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.bench.greedy_parity import GreedyStream, greedy_difference

MAX_NEW_TOKENS = 32
RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker who had never once left the valley. Every morning he",
]
CHAT_PROMPTS = [
    "What is 2+2?",
    "Write a haiku about the sea.",
]


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    encoded = [tokenizer(p)["input_ids"] for p in RAW_PROMPTS]
    for content in CHAT_PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
        encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return encoded


def reference(model, input_ids: list[int]) -> tuple[GreedyStream, list[float]]:
    """transformers' greedy tokens with its own top two at each position (from `generate`'s
    logits), and its best logit at each position."""
    ids = torch.tensor([input_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                         do_sample=False, pad_token_id=2, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(input_ids):].tolist()
    top2, best = [], []
    for logits in out.logits:
        top = torch.log_softmax(logits[0].float(), dim=-1).topk(2)
        top2.append(list(zip(top.indices.tolist(), top.values.tolist())))
        best.append(float(logits[0].max()))
    return GreedyStream(tokens, [f"<{t}>" for t in tokens], top2), best


def bfloat16_step(logit: float) -> float:
    """One bfloat16 step (unit in the last place) at this logit's size: two logits that close are
    a tie the last bit of any kernel decides."""
    return 2.0 ** (math.floor(math.log2(max(abs(logit), 2.0 ** -126))) - 7)


@pytest.fixture(params=["float32", "bfloat16"])
def engine_and_reference(request: pytest.FixtureRequest, smollm2_each_layout):
    """Each KV cache layout in turn, with transformers' module in the same dtype: float32, and
    bfloat16 (`--dtype auto`'s choice on a CPU with bfloat16 units)."""
    if request.param == "float32":
        return smollm2_each_layout, request.getfixturevalue("smollm2_reference")
    name = "smollm2_paged_bf16_model" if smollm2_each_layout.kv_cache == "paged" else "smollm2_bf16_model"
    return request.getfixturevalue(name), request.getfixturevalue("smollm2_bf16_reference")


def test_greedy_batch_equals_transformers_generate(engine_and_reference, prompts):
    """Five prompts (raw and chat-templated, 5 to 38 tokens) in one batch: every request's 32 greedy
    tokens (or fewer, up to EOS) equal `generate(do_sample=False)` run on that prompt alone, in the
    same dtype. In bfloat16 a request may part from it only where transformers' own two best logits
    are one bfloat16 step apart and ztgi took the other: transformers itself decides such ties
    differently with its two decode kernels for grouped-query attention (one query per head when
    no mask is passed, as here; a key head's queries packed together when one is) and between a
    prompt alone and in a padded batch (BENCHMARKS.md, issue 23)."""
    model, reference_model = engine_and_reference
    assert len({len(p) for p in prompts}) >= 5
    requests = [request(i, ids, MAX_NEW_TOKENS) for i, ids in enumerate(prompts)]
    got = token_ids(run_to_end(model, batch_of(model, requests)))
    for i, ids in enumerate(prompts):
        expected, best_logits = reference(reference_model, ids)
        stream = GreedyStream(got[i], [f"<{t}>" for t in got[i]])
        if model.dtype == torch.float32:
            assert got[i] == expected.ids, f"prompt {i} diverged"
            continue
        at = next((j for j, (a, b) in enumerate(zip(expected.ids, got[i])) if a != b), 0)
        difference = greedy_difference(expected, stream, tolerance=bfloat16_step(best_logits[at]))
        assert difference is None, f"prompt {i}: {difference}"
    assert any(len(tokens) == MAX_NEW_TOKENS for tokens in got.values())
    assert any(len(tokens) < MAX_NEW_TOKENS for tokens in got.values())  # some stopped on EOS
