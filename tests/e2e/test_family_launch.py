"""`ztgi launch --model-id DIR` on tiny random Gemma 2 (sliding windows, soft-capping) and Mistral
(every layer sliding): the native paged worker's greedy tokens over HTTP equal transformers'
`generate`, and Mistral's blocks behind the window go back to the pool while requests run."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.worker.models.family_models import WINDOW, save_family_model

PROMPT = ("Once upon a time, in a small village at the edge of a great forest, there lived an old "
          "clockmaker who")
NUM_TOKENS = 16


@pytest.fixture(scope="module")
def gemma2_dir(smollm2, tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_family_model("gemma2", str(tmp_path_factory.mktemp("gemma2")), smollm2.path)


@pytest.mark.slow
def test_launched_gemma2_greedy_equals_transformers(gemma2_dir: str, tmp_path_factory) -> None:
    """/generate (greedy, details) through every process, worker on --kv-cache paged: the prompt's
    ids and the 16 generated ids equal the tokenizer's and `generate(do_sample=False)`'s."""
    ids = AutoTokenizer.from_pretrained(gemma2_dir)(PROMPT)["input_ids"]
    assert len(ids) > 2 * WINDOW
    reference = AutoModelForCausalLM.from_pretrained(gemma2_dir, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    tensor = torch.tensor([ids])
    expected = reference.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=NUM_TOKENS,
                                  do_sample=False, pad_token_id=2)[0, len(ids):].tolist()
    server = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", gemma2_dir, "--kv-cache", "paged",
                            "--dtype", "float32",
                            "--max-input-tokens", "256", "--max-total-tokens", "512",
                            "--max-batch-prefill-tokens", "512")
    try:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": NUM_TOKENS, "details": True,
                                                 "decoder_input_details": True}}
        response = server.post("/generate", body)
        assert response.status_code == 200, response.text
        details = response.json()["details"]
        assert [t["id"] for t in details["prefill"]] == ids
        assert [t["id"] for t in details["tokens"]] == expected[:len(details["tokens"])]
        assert len(details["tokens"]) == len(expected)
    finally:
        assert server.stop() == 0, server.log


@pytest.fixture(scope="module")
def mistral_dir(smollm2, tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_family_model("mistral", str(tmp_path_factory.mktemp("mistral")), smollm2.path)


@pytest.mark.slow
def test_sliding_window_blocks_are_freed_while_requests_run(mistral_dir: str, tmp_path_factory) -> None:
    """Mistral (every layer within a window of 8) on a pool of 32 blocks of 4: four requests of 64
    tokens each (64 blocks together) run at once without a preemption, because each one's blocks
    behind its window go back to the pool as it decodes, and their greedy ids equal transformers'."""
    tokenizer = AutoTokenizer.from_pretrained(mistral_dir)
    reference = AutoModelForCausalLM.from_pretrained(mistral_dir, dtype=torch.float32).eval()
    prompts = [f"{PROMPT} {word}" for word in ("made", "sold", "fixed", "kept")]
    server = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", mistral_dir, "--dtype", "float32",
                            "--block-size", "4", "--max-batch-total-tokens", "128", "--max-input-tokens", "64",
                            "--max-total-tokens", "128", startup_timeout_s=600)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda prompt: _greedy_ids(server, prompt, 40), prompts))
        families = text_string_to_metric_families(server.get("/metrics").text)
        assert sum(s.value for f in families for s in f.samples if s.name.startswith("ztgi_preemptions")) == 0
    finally:
        assert server.stop() == 0, server.log
    for prompt, ids in zip(prompts, answers):
        tensor = torch.tensor([tokenizer(prompt)["input_ids"]])
        expected = reference.generate(tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=40,
                                      do_sample=False, pad_token_id=2)[0, tensor.shape[1]:].tolist()
        assert ids == expected, prompt


def _greedy_ids(server: LaunchedServer, prompt: str, num_tokens: int) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": num_tokens, "ignore_eos": True, "details": True}}
    response = server.post("/generate", body)
    assert response.status_code == 200, response.text
    return [t["id"] for t in response.json()["details"]["tokens"]]
