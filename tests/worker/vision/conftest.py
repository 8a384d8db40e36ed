"""The tiny vision-language models on the paged engine in float32, and transformers' own, by family."""

from __future__ import annotations

import pytest
import torch

from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.paged.model import PagedModel

FAMILIES = ("idefics3", "qwen2_vl", "qwen2_5_vl")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def family_dir(family: str, vision_dirs: dict[str, str]) -> str:
    return vision_dirs[family]


@pytest.fixture(scope="module")
def vision_model(family_dir: str) -> PagedModel:
    """The family's tiny model on the paged engine (blocks of 4, so spans cross blocks)."""
    model = load_model(family_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    assert isinstance(model, PagedModel)
    model.allocate_pool(512)
    return model


@pytest.fixture(scope="module")
def vision_reference(family_dir: str) -> torch.nn.Module:
    """The same model as transformers runs it (`generate`)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(family_dir, dtype=torch.float32).eval()
