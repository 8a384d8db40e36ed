"""The paged engine with LoRA adapters: one batch mixing three adapters and the base model gives
each request the greedy tokens of PEFT's merged model (float32), for a Llama and a Qwen2 model."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from transformers import AutoTokenizer

from tests.lora_adapters import RECIPES, fused_recipe, merged_greedy, save_adapter
from tests.worker.engine_helpers import batch_of, request, run_chunked, run_to_end, token_ids
from tests.worker.models.family_models import save_family_model
from ztgi.common.messages import AdapterRef
from ztgi.services.worker.model_loader import load_model

MAX_NEW_TOKENS = 10
PROMPTS = [
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "def fibonacci(n):\n    if n < 2:",
    "The capital of France is",
    "List three colours:",
]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2", "phi3"])
def base_dir(request, smollm2, tiny_model_dir, tmp_path_factory) -> str:
    if request.param == "llama":
        return tiny_model_dir
    return save_family_model(request.param, str(tmp_path_factory.mktemp(request.param)), smollm2.path)


@pytest.fixture(scope="module")
def adapters(base_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    with open(os.path.join(base_dir, "config.json")) as file:
        fused = json.load(file)["model_type"] == "phi3"  # Phi-3's fused q/k/v and gate/up are adapted whole
    return {name: save_adapter(base_dir, str(root / name), fused_recipe(recipe) if fused else recipe)
            for name, recipe in RECIPES.items()}


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def test_mixed_batch_equals_merged_models(base_dir, adapters, prompts):
    """Every prompt under every adapter and the base, 16 requests in one batch (and again in
    prefill chunks of 5): each equals its merged model's greedy tokens."""
    model = load_model(base_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    model.allocate_pool(1024)
    names = [None, *adapters]
    refs = {name: AdapterRef(name, path, 1) for name, path in adapters.items()}
    expected = {}
    requests = []
    for name in names:
        reference = merged_greedy(base_dir, adapters.get(name), prompts, MAX_NEW_TOKENS)
        for ids, tokens in zip(prompts, reference, strict=True):
            seq_id = len(requests)
            requests.append(dataclasses.replace(request(seq_id, ids, MAX_NEW_TOKENS, ignore_eos=True),
                                                adapter=refs.get(name)))
            expected[seq_id] = tokens
    assert len({tuple(tokens) for tokens in expected.values()}) > len(prompts), "the adapters change answers"
    assert token_ids(run_to_end(model, batch_of(model, requests))) == expected
    assert token_ids(run_chunked(model, requests, 5)) == expected



def test_speculation_with_adapters_equals_merged_models(tiny_model_dir, tmp_path_factory, prompts):
    """--speculate 4 (prompt lookup on repetitive prompts, so proposals are made and verified under
    each request's adapter): the tokens are still each merged model's."""
    root = tmp_path_factory.mktemp("spec-adapters")
    adapters = {name: save_adapter(tiny_model_dir, str(root / name), recipe) for name, recipe in RECIPES.items()}
    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4, speculate=4)
    model.allocate_pool(1024)
    repetitive = [ids * 3 for ids in prompts[2:]]
    requests, expected = [], {}
    for name in [None, *adapters]:
        ref = AdapterRef(name, adapters[name], 1) if name else None
        for ids, tokens in zip(repetitive, merged_greedy(tiny_model_dir, adapters.get(name), repetitive, 16),
                               strict=True):
            requests.append(dataclasses.replace(request(len(requests), ids, 16 + 8, ignore_eos=True), adapter=ref,
                                                max_new_tokens=16))
            expected[len(requests) - 1] = tokens
    batch, got, num_proposed = batch_of(model, requests), {}, 0
    while batch is not None:
        generations, batch, timings = model.generate_token(batch)
        num_proposed += timings.num_proposed
        for generation in generations:
            got.setdefault(generation.seq_id, []).append(generation)
    assert token_ids(got) == expected
    assert num_proposed > 0
