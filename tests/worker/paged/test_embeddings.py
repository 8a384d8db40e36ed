"""Embedding requests on the paged engine: pooled final hidden states equal transformers' in float32."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_to_end, step
from tests.worker.models.family_models import save_family_model
from ztgi.common.messages import SeqUpdate
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.models.pooling import POOLING_CONFIG, Pooling, pooling_of, read_pooling

TEXTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "def fibonacci(n):\n    if n < 2:",
]


@pytest.fixture(scope="module")
def qwen3_dir(smollm2, tmp_path_factory) -> str:
    return save_family_model("qwen3", str(tmp_path_factory.mktemp("qwen3")), smollm2.path)


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    return [tokenizer(text)["input_ids"] for text in TEXTS]


def _reference(directory: str, prompts: list[list[int]], mode: str) -> list[np.ndarray]:
    """transformers' final hidden states (after the final norm), pooled and normalised (the causal LM
    class: SmolLM2's tied embedding is stored under lm_head, which AutoModel would leave random)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    vectors = []
    with torch.no_grad():
        for ids in prompts:
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            pooled = {"last": states[-1], "cls": states[0], "mean": states.mean(dim=0)}[mode]
            vectors.append(torch.nn.functional.normalize(pooled, dim=0).numpy())
    return vectors


def _embeddings(model, requests, chunk: int | None = None) -> dict[int, np.ndarray]:
    batch = batch_of(model, [dataclasses.replace(r, chunk_len=chunk) for r in requests])
    into: dict = {}
    while batch is not None:
        batch = step(model, batch, into)
        if batch is not None:
            batch.apply([SeqUpdate(s.seq_id, [], chunk) for s in batch.sequences if s.is_prefilling])
    assert all(len(generations) == 1 for generations in into.values()), "one step's token, no decode"
    return {seq_id: np.frombuffer(generations[0].embedding, dtype="<f4") for seq_id, generations in into.items()}


@pytest.mark.parametrize("mode", ["last", "mean", "cls"])
def test_pooled_hidden_states_equal_transformers(qwen3_dir, prompts, mode):
    """Three prompts of 6 to 24 tokens in one batch, whole and in chunks of 5: each embedding equals
    transformers' final hidden state pooled (last token by default, mean or CLS by a pooling config)
    and normalised, within 1e-5."""
    model = load_model(qwen3_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    model.pooler.mode = mode
    model.allocate_pool(512)
    requests = [request(i, ids, 1, embed=True) for i, ids in enumerate(prompts)]
    expected = _reference(qwen3_dir, prompts, mode)
    for chunk in (None, 5):
        got = _embeddings(model, requests, chunk)
        for i, vector in enumerate(expected):
            assert got[i].shape == (64,)
            np.testing.assert_allclose(got[i], vector, atol=1e-5)


def test_embedding_beside_generation(qwen3_dir, prompts):
    """An embedding request batched with a generating one: its vector is the same as alone, and the
    generation's tokens are those it makes alone."""
    model = load_model(qwen3_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    model.allocate_pool(512)
    alone = _embeddings(model, [request(0, prompts[1], 1, embed=True)])[0]
    generating = request(1, prompts[0], 6, ignore_eos=True)
    by_itself = [g.token_id for g in run_to_end(model, batch_of(model, [generating]))[1]]
    together = run_to_end(model, batch_of(model, [request(0, prompts[1], 1, embed=True), generating]))
    np.testing.assert_array_equal(np.frombuffer(together[0][0].embedding, dtype="<f4"), alone)
    assert [g.token_id for g in together[1]] == by_itself
    assert all(g.embedding is None for g in together[1])


def test_padded_engine_refuses_embedding_per_request(qwen3_dir, prompts):
    """The padded engine cannot return hidden states: an embedding request ends in an error saying so,
    and says so in its info, while the request beside it generates."""
    model = load_model(qwen3_dir, dtype="float32", device="cpu", kv_cache="padded")
    assert model.info().pooling is None and "paged engine" in model.info().pooling_error
    generations = run_to_end(model, batch_of(model, [request(0, prompts[0], 1, embed=True),
                                                      request(1, prompts[1], 3, ignore_eos=True)]))
    assert generations[0][0].finish_reason == "error" and "paged engine" in generations[0][0].error
    assert len(generations[1]) == 3


def test_pooling_config(tmp_path):
    """No pooling config: last token; sentence-transformers' 1_Pooling selects mean or cls; a mode not
    computed here (max) or none at all leaves the model unable to pool, with the reason."""
    assert read_pooling(str(tmp_path), object()) == Pooling("last")
    assert pooling_of({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}) == Pooling("mean")
    assert pooling_of({"pooling_mode_cls_token": True}) == Pooling("cls")
    assert pooling_of({"pooling_mode_lasttoken": True}) == Pooling("last")
    assert "max_tokens" in pooling_of({"pooling_mode_max_tokens": True}).error
    assert pooling_of({}).mode is None
    os.makedirs(tmp_path / "1_Pooling")
    (tmp_path / POOLING_CONFIG).write_text(json.dumps({"word_embedding_dimension": 64,
                                                       "pooling_mode_mean_tokens": True}))

    class Matryoshka:
        matryoshka_dimensions = [32, 64]

    assert read_pooling(str(tmp_path), Matryoshka()) == Pooling("mean", None, True)


def test_llama_forward_pools_as_transformers(smollm2, prompts):
    """SmolLM2 (the Llama forward, its fused residual-and-norm steps) in float32: last-token embeddings
    equal transformers' within 1e-5; served as the GGUF stores it (the default dtype and 4-bit blocks)
    they stay close to them (cosine > 0.99)."""
    expected = _reference(smollm2.path, prompts, "last")
    exact = load_model(smollm2.path, dtype="float32", device="cpu", kv_cache="paged", block_size=16)
    exact.allocate_pool(64)
    requests = [request(i, ids, 1, embed=True) for i, ids in enumerate(prompts)]
    for i, vector in _embeddings(exact, requests).items():
        np.testing.assert_allclose(vector, expected[i], atol=1e-5)
    stored = load_model(smollm2.gguf_file, device="cpu", kv_cache="paged", block_size=16)
    stored.allocate_pool(64)
    for i, vector in _embeddings(stored, requests).items():
        assert float(np.dot(vector, expected[i])) > 0.99, (stored.dtype, float(np.dot(vector, expected[i])))


def test_a_pooling_config_in_the_model_dir_selects_the_pooling(qwen3_dir, prompts, tmp_path):
    """The same weights with sentence-transformers' 1_Pooling/config.json (mean) and a Matryoshka
    declaration: the worker says so in its info and its embeddings are mean-pooled."""
    import shutil

    directory = str(tmp_path / "qwen3-mean")
    shutil.copytree(qwen3_dir, directory)
    os.makedirs(os.path.join(directory, "1_Pooling"))
    with open(os.path.join(directory, POOLING_CONFIG), "w") as file:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}, file)
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump({**config, "matryoshka_dimensions": [32, 64]}, file)
    model = load_model(directory, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    info = model.info()
    assert (info.pooling, info.matryoshka, info.hidden_size) == ("mean", True, 64)
    model.allocate_pool(128)
    got = _embeddings(model, [request(0, prompts[1], 1, embed=True)])[0]
    np.testing.assert_allclose(got, _reference(qwen3_dir, [prompts[1]], "mean")[0], atol=1e-5)
