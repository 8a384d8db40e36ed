"""`LLM.embed`: the server's embedding requests in this process, equal to transformers' pooled states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ztgi import LLM, EmbeddingRequestOutput, SamplingParams

TEXTS = ["The capital of France is", "Hi", "A longer sentence about a clockmaker who lived at the edge of a forest"]


def _expected(reference: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        last = reference(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
    return torch.nn.functional.normalize(last, dim=0).numpy()


def test_embed_equals_transformers_and_generation_goes_on(llm: LLM, reference: torch.nn.Module) -> None:
    """Three prompts (text and token ids) embedded together: each the last token's final hidden state,
    normalised, within 1e-5 of transformers'; a generation afterwards is unaffected."""
    tokenizer = llm.get_tokenizer()
    outputs = llm.embed([TEXTS[0], {"prompt_token_ids": tokenizer(TEXTS[1])["input_ids"]}, TEXTS[2]])
    assert all(isinstance(output, EmbeddingRequestOutput) for output in outputs)
    for text, output in zip(TEXTS, outputs):
        assert output.prompt_token_ids == tokenizer(text)["input_ids"]
        np.testing.assert_allclose(output.outputs.embedding, _expected(reference, output.prompt_token_ids), atol=1e-5)
    truncated = llm.embed(TEXTS[2], truncate_prompt_tokens=4)[0]
    np.testing.assert_allclose(truncated.outputs.embedding,
                               _expected(reference, tokenizer(TEXTS[2])["input_ids"][-4:]), atol=1e-5)
    assert llm.generate("Hi", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids


def test_bad_prompt_is_a_value_error(llm: LLM) -> None:
    """An empty prompt or an id outside the vocabulary: ValueError naming the prompt, nothing queued."""
    with pytest.raises(ValueError, match="prompt 1"):
        llm.embed(["fine", ""])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.embed({"prompt_token_ids": [1, 10**6]})
    assert len(llm.embed("fine")) == 1
