"""`ztgi launch --model-id DIR` on a tiny random Gemma 2 (sliding windows, soft-capping): the native
paged worker's greedy tokens over HTTP equal transformers' `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.worker.paged.family_models import WINDOW, save_family_model

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
