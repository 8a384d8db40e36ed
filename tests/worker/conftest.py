"""Worker fixtures: the tiny random model and the embedded SmolLM2 as engine Models, loaded once."""

from __future__ import annotations

import pytest

from services.worker.model import Model


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: str) -> Model:
    """The 2-layer random Llama on CPU in float32."""
    return Model(tiny_model_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def smollm2_model(smollm2) -> Model:
    """SmolLM2-135M-Instruct on CPU in float32."""
    return Model(smollm2.path, dtype="float32", device="cpu")
