"""Every natively served family: the paged engine's greedy tokens equal transformers' `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_chunked, run_to_end, token_ids
from tests.worker.models.family_models import WINDOW, save_family_model
from ztgi.services.worker.model_loader import load_model, resolve_kv_cache
from ztgi.services.worker.models.families import FAMILIES, layer_windows

MAX_NEW_TOKENS = 12
PROMPTS = [
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:",
    "The capital of France is",
]


# Qwen2-VL's text models have no causal LM of their own: tests/worker/vision runs them with their images
CAUSAL_LM_FAMILIES = sorted(set(FAMILIES) - {"qwen2_vl_text", "qwen2_5_vl_text"})


@pytest.fixture(scope="module", params=CAUSAL_LM_FAMILIES)
def family_dir(request, smollm2, tmp_path_factory) -> str:
    return save_family_model(request.param, str(tmp_path_factory.mktemp(request.param)), smollm2.path)


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def _reference(directory: str, prompts: list[list[int]]) -> dict[int, list[int]]:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    out = {}
    for i, ids in enumerate(prompts):
        tensor = torch.tensor([ids])
        generated = model.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=MAX_NEW_TOKENS,
                                   do_sample=False, pad_token_id=2)
        out[i] = generated[0, len(ids):].tolist()
    return out



def test_greedy_equals_transformers_generate(family_dir, prompts):
    """Three prompts (5 to 24 tokens, past the window of 8) in one paged batch, whole and in chunks
    of 5: each request's greedy tokens equal `generate(do_sample=False)` on that prompt alone."""
    model = load_model(family_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    model.allocate_pool(512)
    assert max(len(p) for p in prompts) > 2 * WINDOW
    requests = [request(i, ids, MAX_NEW_TOKENS) for i, ids in enumerate(prompts)]
    expected = _reference(family_dir, prompts)
    assert token_ids(run_to_end(model, batch_of(model, requests))) == expected
    assert token_ids(run_chunked(model, requests, 5)) == expected


def test_sliding_window_changes_the_answer(family_dir, prompts):
    """Where a family has sliding layers, the same weights attending to everything answer
    differently: the equality above is not blind to the window."""
    model = load_model(family_dir, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    if not any(layer_windows(model.loaded.config)):
        pytest.skip(f"{model.loaded.config.model_type} has no sliding layers")
    model.allocate_pool(512)
    requests = [request(i, ids, MAX_NEW_TOKENS, ignore_eos=True) for i, ids in enumerate(prompts)]
    windowed = token_ids(run_to_end(model, batch_of(model, requests)))
    for layer in model.forward_pass.decoder.layers:
        object.__setattr__(layer, "window", None)
    assert token_ids(run_to_end(model, batch_of(model, requests))) != windowed


def test_unsupported_architecture_names_the_supported_ones():
    """--kv-cache paged for an architecture without a native forward: a ValueError naming them;
    auto falls back to the padded transformers forward."""
    from transformers import GPT2Config

    supported = "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, qwen2_vl_text, qwen2_5_vl_text"
    with pytest.raises(ValueError, match=f"gpt2.*supported: {supported}"):
        resolve_kv_cache("paged", "auto", GPT2Config())
    assert resolve_kv_cache("auto", "auto", GPT2Config()) == "padded"


@pytest.mark.slow
def test_gguf_of_a_family_serves_natively(smollm2, prompts, tmp_path, monkeypatch):
    """A Qwen2 GGUF file (biased q/k/v, the SmolLM2 tokenizer and chat template inside) loads through
    transformers' GGUF reader onto the native paged forward, and its greedy tokens equal the
    original model's `generate`."""
    from transformers import Qwen2Config

    from tests.worker.models.family_gguf import write_qwen2_gguf
    from tests.worker.models.family_models import COMMON
    from ztgi.common.model_source import resolve_model

    monkeypatch.setenv("ZTGI_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    original = AutoModelForCausalLM.from_config(Qwen2Config(**COMMON, tie_word_embeddings=False)).eval()
    path = str(tmp_path / "tiny-qwen2.gguf")
    write_qwen2_gguf(original, path)
    model = load_model(path, dtype="float32", device="cpu", kv_cache="paged", block_size=4)
    assert type(model.forward_pass).__name__ == "PagedDecoderForward"
    model.allocate_pool(512)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(path).path)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(smollm2.path).chat_template
    expected = {}
    for i, ids in enumerate(prompts):
        tensor = torch.tensor([ids])
        expected[i] = original.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=MAX_NEW_TOKENS,
                                        do_sample=False, pad_token_id=2)[0, len(ids):].tolist()
    requests = [request(i, ids, MAX_NEW_TOKENS) for i, ids in enumerate(prompts)]
    assert token_ids(run_to_end(model, batch_of(model, requests))) == expected
