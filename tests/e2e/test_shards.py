"""`ztgi launch --num-shard 2` (two worker groups of two ranks each, tiny random Qwen2 in float32):
greedy tokens and logprobs over HTTP equal transformers', and under a LoRA adapter its merged
model's; kill -9 of one group's rank under 8 streams, every stream completes unchanged on the other
group and the killed group starts again and serves; a split the model's heads do not allow stops
the worker at start with the sizes that work."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.e2e.test_process_loss import stream
from tests.lora_adapters import RECIPES, merged_greedy, save_adapter
from tests.worker.models.family_models import save_family_model
from ztgi.bench.greedy_parity import GreedyStream, assert_same_greedy

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The best way to learn is",
           "Water boils at", "My favourite food is", "import numpy as np", "The sun is"]
NUM_TOKENS = 200  # long enough for the kill to land mid-stream


@pytest.fixture(scope="module")
def qwen2_dir(smollm2, tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_family_model("qwen2", str(tmp_path_factory.mktemp("qwen2")), smollm2.path)


@pytest.fixture(scope="module")
def adapter_dir(qwen2_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_adapter(qwen2_dir, str(tmp_path_factory.mktemp("sage")), RECIPES["sage"])


@pytest.fixture(scope="module")
def server(qwen2_dir: str, adapter_dir: str, tmp_path_factory: pytest.TempPathFactory):
    server = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", qwen2_dir, "--num-shard", "2",
                            "--lora-adapters", f"sage={adapter_dir}",
                            "--num-workers", "2", "--dtype", "float32", "--max-input-tokens", "256",
                            "--max-total-tokens", "512", "--max-batch-prefill-tokens", "512",
                            "--placement", "round-robin", startup_timeout_s=180.0)
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log


def test_greedy_tokens_and_logprobs_equal_transformers(server: LaunchedServer, qwen2_dir: str) -> None:
    reference = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    for prompt in PROMPTS[:4]:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=12, do_sample=False, pad_token_id=2, output_scores=True,
                                     return_dict_in_generate=True)
        expected = out.sequences[0, len(ids):].tolist()
        logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, expected)]
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 12, "details": True}}
        response = server.post("/generate", body)
        assert response.status_code == 200, response.text
        tokens = response.json()["details"]["tokens"]
        assert [t["id"] for t in tokens] == expected, prompt
        assert [t["logprob"] for t in tokens] == pytest.approx(logprobs, abs=1e-3), prompt


def test_an_adapter_in_a_group_gives_its_merged_models_tokens(server: LaunchedServer, qwen2_dir: str,
                                                              adapter_dir: str) -> None:
    """Each rank cuts the adapter as its weights are cut (docs/shards.md)."""
    ids = AutoTokenizer.from_pretrained(qwen2_dir)(PROMPTS[0])["input_ids"]
    [expected] = merged_greedy(qwen2_dir, adapter_dir, [ids], 12)
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 12, "details": True, "adapter_id": "sage"}}
    response = server.post("/generate", body)
    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["details"]["tokens"]] == expected


def all_streams(server: LaunchedServer, during=None) -> list[GreedyStream]:
    started: list = []
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(stream, server, prompt, started, NUM_TOKENS) for prompt in PROMPTS]
        if during is not None:
            while len(started) < 3 * len(PROMPTS):
                time.sleep(0.02)
            during()
        return [future.result() for future in futures]


def pids(parent: int, pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", pattern], capture_output=True, text=True).stdout
    return sorted(int(pid) for pid in out.split())


@pytest.mark.slow
def test_killed_rank_takes_its_group_out_and_the_group_comes_back(server: LaunchedServer) -> None:
    expected = all_streams(server)
    group_leader = pids(server.process.pid, "services.worker")[0]
    [rank_1] = pids(group_leader, "ztgi.services.worker")
    killed_at = len(server.log)
    for reference, resumed in zip(expected, all_streams(server, lambda: os.kill(rank_1, signal.SIGKILL))):
        assert_same_greedy(reference, resumed)
    after = server.log[killed_at:]
    # rank 0 hears of it from its watch on the ranks or from the collective it was in, whichever first
    assert re.search(r"rank 1 of the group exited|the worker group cannot go on: .* failed on rank 0", after), after
    assert re.search(r"lost \(disconnected\): [1-9]\d* requests go back", after), after
    deadline = time.monotonic() + 120
    while not re.search(r"worker\[0\] rank 1 .*warmup: ", server.log[killed_at:]):
        assert time.monotonic() < deadline, server.log[killed_at:]
        time.sleep(0.5)
    for reference, again in zip(expected, all_streams(server)):  # both groups serve again
        assert_same_greedy(reference, again)


def test_a_split_the_heads_do_not_allow_stops_the_worker_at_start(qwen2_dir: str) -> None:
    done = subprocess.run([sys.executable, "-m", "ztgi.services.worker", "--model-id", qwen2_dir,
                           "--num-shard", "3"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--num-shard 3 does not split this model (4 query heads, 2 KV heads, intermediate size 128): " \
           "it splits into 1, 2, 4" in done.stderr, done.stderr
