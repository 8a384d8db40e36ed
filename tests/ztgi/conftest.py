"""Fixtures for the public package: one `LLM` over the embedded SmolLM2, and transformers' own model."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from ztgi import LLM


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread, as the worker tests: the suite shares 2 cores with other processes."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="package")
def llm(smollm2) -> Iterator[LLM]:
    """SmolLM2-135M-Instruct on CPU in float32, loaded and warmed up once."""
    yield LLM(smollm2.path, dtype="float32", device="cpu")
    gc.unfreeze()  # LLM froze the objects alive at its start; the rest of the suite collects them again


@pytest.fixture(scope="package")
def reference(smollm2) -> torch.nn.Module:
    """SmolLM2-135M-Instruct as a plain `transformers` module: what `generate` runs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()


def greedy_reference(model: torch.nn.Module, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """`generate(do_sample=False)` on one prompt alone: its new ids, up to EOS included."""
    ids = torch.tensor([input_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=2)
    return out[0, len(input_ids):].tolist()
