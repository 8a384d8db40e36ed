"""Without ztgi's C kernels the paged worker serves from torch's ops: the same greedy text as with
them, and a log line that says why (docs/kernels.md).

The kernels serve bfloat16 on CPU only (in float32 torch's ops run either way, so there is nothing
to compare), so these tests run SmolLM2 in bfloat16: once as built here, and once with the kernels
taken away, as a machine without a C compiler (`CC` naming no program) or `--no-native-kernels`
takes them away. The two paths round bfloat16 attention differently, so a text may part from the
other at a near-tie: where both paths rank the same two tokens first, a few bfloat16 steps apart.
"""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from tests.worker.conftest import TEST_POOL_BLOCKS
from tests.worker.engine_helpers import batch_of, request, run_to_end
from ztgi.common.messages import Generation
from ztgi.common.model_source import ModelSource
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.paged.model import PagedModel

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "What is 2+2?", "Write a haiku about the sea.")
MAX_NEW_TOKENS = 24
NEAR_TIE = 0.25  # logprob gap: a few bfloat16 steps at this model's logits, far below a real preference
TORCH_ATTENTION = "attention over gathered blocks (torch)"
C_ATTENTION = "attention in place (C kernels), layer steps in C"


def _greedy(model: PagedModel, smollm2: ModelSource) -> list[list[Generation]]:
    """Each prompt's greedy generations with their top two, the prompts stepped as one batch."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    requests = [request(i, tokenizer(p)["input_ids"], MAX_NEW_TOKENS, top_n_tokens=2) for i, p in enumerate(PROMPTS)]
    got = run_to_end(model, batch_of(model, requests))
    return [got[i] for i in range(len(PROMPTS))]


def _difference(kernels: list[Generation], fallback: list[Generation]) -> str | None:
    """None when the two streams are equal, or part where both paths' top two are the same two tokens
    within NEAR_TIE of each other; else where and how they differ."""
    ids = [g.token_id for g in kernels], [g.token_id for g in fallback]
    if ids[0] == ids[1]:
        return None
    at = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), None)
    if at is None:
        return f"one stream stops early: {ids}"
    for stream in (kernels, fallback):
        generation = stream[at]
        if set(generation.top_ids) != {ids[0][at], ids[1][at]}:
            return f"position {at}: the top two {generation.top_ids} are not the two tokens taken"
        if generation.top_logprobs[0] - generation.top_logprobs[1] > NEAR_TIE:
            return f"position {at}: gap {generation.top_logprobs[0] - generation.top_logprobs[1]:.3f}, no near-tie"
    return None


@pytest.fixture(scope="module")
def with_kernels(smollm2_paged_bf16_model: PagedModel, smollm2: ModelSource) -> list[list[Generation]]:
    if smollm2_paged_bf16_model.forward_pass.attention.native is None:
        pytest.skip("the C kernels do not build here (no AVX512-BF16 CPU or no C compiler): nothing to fall back from")
    return _greedy(smollm2_paged_bf16_model, smollm2)


@pytest.mark.parametrize("taken_away", ["no C compiler", "--no-native-kernels"])
def test_torch_path_serves_the_same_greedy_text_and_says_why(taken_away, with_kernels, smollm2, monkeypatch, caplog):
    """With `CC` naming no program, or `--no-native-kernels`, the model's attention and layer steps
    are torch's, its log names that path (and, without a compiler, why), and its greedy texts equal
    the kernels' ones up to a near-tie (most of them exactly)."""
    native_kernels = taken_away != "--no-native-kernels"
    if native_kernels:
        monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.INFO, logger="ztgi.services.worker"):
        model = load_model(smollm2.path, dtype="bfloat16", device="cpu", kv_cache="paged",
                           native_kernels=native_kernels)
    assert isinstance(model, PagedModel)
    model.allocate_pool(TEST_POOL_BLOCKS)
    assert model.forward_pass.attention.native is None
    assert TORCH_ATTENTION in caplog.text and C_ATTENTION not in caplog.text
    if native_kernels:  # asked for, and none could be built: the log says why
        assert "attention: torch's, the C kernel cannot run here" in caplog.text
        assert "the C compiler '/nonexistent/cc' does not run" in caplog.text
    fallback = _greedy(model, smollm2)
    assert [_difference(k, f) for k, f in zip(with_kernels, fallback, strict=True)] == [None] * len(PROMPTS)
    exactly = sum([g.token_id for g in k] == [g.token_id for g in f] for k, f in zip(with_kernels, fallback))
    assert exactly >= len(PROMPTS) - 1


def test_the_kernels_run_where_they_build(smollm2_paged_bf16_model, with_kernels):
    """The comparison above is between two paths: as built here, the model's attention is the C kernels'."""
    assert smollm2_paged_bf16_model.forward_pass.attention.native is not None
    assert all(len(stream) > 0 for stream in with_kernels)


def test_a_real_difference_is_not_a_near_tie():
    """The near-tie rule itself: two streams parting where one path's top two are far apart differ."""
    def generation(token_id: int, top_ids: list[int], top_logprobs: list[float]) -> Generation:
        return Generation(seq_id=0, token_id=token_id, logprob=top_logprobs[0], top_ids=top_ids,
                          top_logprobs=top_logprobs)

    near = [generation(5, [5, 7], [-1.0, -1.1])], [generation(7, [7, 5], [-1.0, -1.05])]
    far = [generation(5, [5, 7], [-0.1, -3.0])], [generation(7, [7, 5], [-1.0, -1.05])]
    assert _difference(*near) is None
    assert "no near-tie" in (_difference(*far) or "")
