"""Worker fixtures: the tiny random model and the embedded SmolLM2 as engine Models, loaded once."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from services.worker.model import Model


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread while these tests run: the suite shares 2 cores with the processes other
    tests start, and oversubscribed OpenMP threads spin-wait (a 10x slowdown measured here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: str) -> Model:
    """The 2-layer random Llama on CPU in float32."""
    return Model(tiny_model_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def smollm2_model(smollm2) -> Model:
    """SmolLM2-135M-Instruct on CPU in float32."""
    return Model(smollm2.path, dtype="float32", device="cpu")
