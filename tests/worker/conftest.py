"""Worker fixtures: the tiny random model and the embedded SmolLM2 as engine Models, loaded once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.padded.model import PaddedModel
from ztgi.services.worker.paged.model import PagedModel

TEST_POOL_BLOCKS = 2048


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread while these tests run: the suite shares 2 cores with the processes other
    tests start, and oversubscribed OpenMP threads spin-wait (a 10x slowdown measured here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: str) -> PaddedModel:
    """The 2-layer random Llama on CPU in float32, padded KV cache."""
    return load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="padded")


@pytest.fixture(scope="session")
def tiny_paged_model(tiny_model_dir: str) -> PagedModel:
    """The 2-layer random Llama on CPU in float32, paged KV cache with a pool of TEST_POOL_BLOCKS."""
    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    model.allocate_pool(TEST_POOL_BLOCKS)
    return model


@pytest.fixture(scope="session")
def tiny_transformers_model(tiny_model_dir: str) -> PaddedModel:
    """The tiny random Llama through the generic `transformers` forward."""
    return load_model(tiny_model_dir, dtype="float32", device="cpu", backend="transformers")


@pytest.fixture(params=["native", "transformers"])
def tiny_model_each_backend(request: pytest.FixtureRequest, tiny_model: PaddedModel,
                            tiny_transformers_model: PaddedModel) -> PaddedModel:
    """The tiny random Llama through each forward in turn (the test runs once per backend)."""
    return tiny_model if request.param == "native" else tiny_transformers_model


@pytest.fixture(scope="session")
def tiny_reference(tiny_model_dir: str) -> torch.nn.Module:
    """The tiny random Llama as a plain `transformers` module: the reference the engine must equal."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_model(smollm2) -> PaddedModel:
    """SmolLM2-135M-Instruct on CPU in float32, padded KV cache."""
    return load_model(smollm2.path, dtype="float32", device="cpu", kv_cache="padded")


@pytest.fixture(scope="session")
def smollm2_paged_model(smollm2) -> PagedModel:
    """SmolLM2-135M-Instruct on CPU in float32, paged KV cache with a pool of TEST_POOL_BLOCKS."""
    model = load_model(smollm2.path, dtype="float32", device="cpu", kv_cache="paged")
    model.allocate_pool(TEST_POOL_BLOCKS)
    return model


@pytest.fixture(scope="session")
def smollm2_reference(smollm2) -> torch.nn.Module:
    """SmolLM2-135M-Instruct as a plain `transformers` module (what `generate` runs)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()


@pytest.fixture(params=["paged", "padded"])
def tiny_each_layout(request: pytest.FixtureRequest, tiny_paged_model: PagedModel, tiny_model: PaddedModel):
    """The tiny random Llama with each KV cache layout in turn (the test runs once per layout)."""
    return tiny_paged_model if request.param == "paged" else tiny_model


@pytest.fixture(params=["paged", "padded"])
def smollm2_each_layout(request: pytest.FixtureRequest, smollm2_paged_model: PagedModel,
                        smollm2_model: PaddedModel):
    """SmolLM2 with each KV cache layout in turn."""
    return smollm2_paged_model if request.param == "paged" else smollm2_model


@pytest.fixture(scope="session")
def smollm2_bf16_model(smollm2) -> PaddedModel:
    """SmolLM2-135M-Instruct on CPU in bfloat16 (`--dtype auto` on a CPU with bfloat16 units), padded KV cache."""
    return load_model(smollm2.path, dtype="bfloat16", device="cpu", kv_cache="padded")


@pytest.fixture(scope="session")
def smollm2_paged_bf16_model(smollm2) -> PagedModel:
    """SmolLM2-135M-Instruct on CPU in bfloat16, paged KV cache with a pool of TEST_POOL_BLOCKS."""
    model = load_model(smollm2.path, dtype="bfloat16", device="cpu", kv_cache="paged")
    model.allocate_pool(TEST_POOL_BLOCKS)
    return model


@pytest.fixture(scope="session")
def smollm2_bf16_reference(smollm2) -> torch.nn.Module:
    """SmolLM2-135M-Instruct as a plain `transformers` module in bfloat16."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.bfloat16).eval()
