"""Shared fixtures: the embedded SmolLM2 and a tiny random-weight model with its tokenizer."""

from __future__ import annotations

import fcntl
import os
import shutil

import pytest

# Servers the tests launch keep the intra-op thread count they start with: a float32 decode step's
# matrix-vector products sum in another order on one thread than on two, and the bit-exact greedy
# comparisons with transformers (which runs on every core) must not depend on what else the box is
# doing at that moment. tests/worker/test_thread_governor.py tests the adaptive policy itself.
os.environ.setdefault("ZTGI_CPU_ADAPTIVE_THREADS", "false")
# `make test` runs two test processes (pytest-xdist), each with its servers, on the same cores. An
# OpenMP thread that spins at a barrier while its partner's core runs the other process costs a
# whole time slice per parallel region, many a step (docs/benchmarks-history.md, "The test run on
# two cores"); waiting passively each takes about its share, and the numerics do not change. Read
# when the OpenMP runtime loads: set before torch is imported here and in every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
# A worker a test starts, and an in-process `LLM`, warms up on 64 prompt tokens, not 512: on CPU the
# warmup measures no memory (the pool is --memory-budget-mb), it runs the step path once and times a
# chunk; 512 tokens cost seconds of each of the suite's many engine starts. tests/worker/test_config.py
# checks the default.
os.environ.setdefault("ZTGI_CPU_WARMUP_PREFILL_TOKENS", "64")

import torch  # noqa: E402

from tests.session_guard import pytest_configure, pytest_sessionfinish, pytest_unconfigure  # noqa: F401
from ztgi.common.model_source import ModelSource, cache_root, resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


@pytest.fixture(scope="session")
def smollm2() -> ModelSource:
    """The embedded SmolLM2-135M-Instruct: `gguf_file` its GGUF (what `--model-id smollm2` serves, as
    stored) and `path` a directory of its weights dequantized, as transformers' GGUF loader computes
    them: the float model the parity tests serve and compare with transformers. ztgi itself never
    writes such a copy; the tests write it once into the ztgi cache."""
    source = resolve_model()
    directory = os.path.join(cache_root(), "test-models", os.path.basename(source.path) + "-float")
    if not os.path.isfile(os.path.join(directory, "model.safetensors")):
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        with open(directory + ".lock", "a") as lock:  # the test processes starting together write it once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.isfile(os.path.join(directory, "model.safetensors")):
                _write_dequantized(source, directory)
    return ModelSource(directory, source.name, source.gguf_file)


def _write_dequantized(source: ModelSource, directory: str) -> None:
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    path, arguments = source.pretrained_arguments()
    model = AutoModelForCausalLM.from_pretrained(path, **arguments)
    staging = directory + f".{os.getpid()}"
    try:
        shutil.copytree(source.path, staging, dirs_exist_ok=True)  # config, generation config, tokenizer
        save_model(model, os.path.join(staging, "model.safetensors"))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk keeps no half-written copy
        raise
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(staging, directory)


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer random-weight Llama with SmolLM2's real tokenizer and vocabulary (fast tests)."""
    return _random_llama(smollm2, str(tmp_path_factory.mktemp("tiny-model")), seed=0, hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="session")
def tiny_draft_dir(smollm2: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1-layer random-weight Llama of its own head shape with SmolLM2's tokenizer: a draft model
    (`--draft-model-id`) for SmolLM2 or the tiny model; its proposals are mostly rejected."""
    return _random_llama(smollm2, str(tmp_path_factory.mktemp("tiny-draft")), seed=1, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="session")
def vision_dirs(smollm2: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tiny random-weight Idefics3 and Qwen2-VL models with their processors (`tests/vision_models.py`),
    by family: `idefics3`, `qwen2_vl`."""
    from tests.vision_models import vision_model_dirs

    return vision_model_dirs(str(tmp_path_factory.mktemp("vision-models")), smollm2.path)


def _random_llama(smollm2: ModelSource, directory: str, seed: int, **sizes: int) -> str:
    """A random-weight Llama of `sizes` with SmolLM2's vocabulary and tokenizer, saved in `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True, **sizes)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    _copy_tokenizer(smollm2.path, directory)
    return directory


def _copy_tokenizer(source_dir: str, directory: str) -> None:
    for name in TOKENIZER_FILES:
        source = os.path.join(source_dir, name)
        if os.path.exists(source):
            shutil.copy(source, directory)
