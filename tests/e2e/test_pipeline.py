"""The whole pipeline as real processes serving SmolLM2: TGI's HTTP API end to end."""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest
import requests
import torch

from tests.e2e.server import LaunchedServer
from ztgi.common.client.sync_client import ZtgiClient

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Translate to French: 'I would like a coffee, please.'\nFrench:",
    "Emoji for happy: 😀, emoji for sad:",
    "中文：你好，世界。English:",
]
NUM_NEW_TOKENS = 32
# These tests hold batching to exact equality: a request's tokens must not depend on what shares its
# batch. That holds in float32; in bfloat16 (`--dtype auto` on CPUs with bf16 units) a row's
# rounding depends on the batch's shape. The default dtype's parity with transformers is tested in
# the worker's own tests (tests/worker/test_generate_parity.py), on both KV layouts.
FLOAT32 = ("--dtype", "float32", "--quantize", "none")  # float weights: the embedded GGUF dequantized, as transformers


@pytest.fixture(scope="module", params=[(), ("--kv-cache", "padded", "--pipeline-decode"), ("--speculate", "4")],
                ids=["one-at-a-time", "padded-pipelined-decode", "speculate-4"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """One launched pipeline (1 worker, 1 tokenizer, 1 gateway) per batching mode: the paged
    worker one command at a time (TGI's loop), the padded worker with the next Decode pipelined
    behind the one running (the scheduler pipelines padded workers only), and the paged worker
    with up to 4 proposed tokens verified per request per step (the same tokens, several a step)."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--max-concurrent-requests", "24",
                              *FLOAT32, *request.param)
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def reference(smollm2) -> dict[str, list[int]]:
    """transformers' greedy `generate` ids for every prompt in float32, computed once for the three
    batching modes (a fixture that took `server` would run again for each)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2.path)
    model = AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32).eval()
    out = {}
    for prompt in PROMPTS:
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=NUM_NEW_TOKENS, do_sample=False)
        out[prompt] = ids[0, inputs["input_ids"].shape[1]:].tolist()
    return out


def generate(server: LaunchedServer, prompt: str, **parameters: object) -> dict:
    response = server.post("/generate", {"inputs": prompt, "parameters": {"details": True, **parameters}})
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: LaunchedServer, prompt: str, **parameters: object) -> list[dict]:
    response = requests.post(server.url + "/generate_stream", json={"inputs": prompt, "parameters": parameters},
                             stream=True, timeout=120)
    assert response.status_code == 200, response.text
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data:"):
            events.append(json.loads(line[len("data:"):]))
    return events


def stats(server: LaunchedServer):
    client = ZtgiClient(server.scheduler_url)
    try:
        return client.stats()
    finally:
        client.close()


def test_greedy_equals_transformers(server: LaunchedServer, reference: dict[str, list[int]]) -> None:
    """Greedy /generate ids equal transformers' generate token for token (5 prompts)."""
    assert server.get("/info").json()["model_dtype"] == "float32"
    for prompt in PROMPTS:
        body = generate(server, prompt, max_new_tokens=NUM_NEW_TOKENS)
        ids = [token["id"] for token in body["details"]["tokens"]]
        expected = reference[prompt]
        if expected[-1] == 2 and len(expected) < NUM_NEW_TOKENS:  # stopped on EOS
            assert body["details"]["finish_reason"] == "eos_token"
        assert ids == expected, prompt


def test_stream_text_equals_generate_text(server: LaunchedServer) -> None:
    """Concatenated streamed token texts equal /generate's text, multi-byte outputs included; every
    request at once (a request's tokens do not depend on its batch in float32)."""
    with concurrent.futures.ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        generated = [pool.submit(generate, server, prompt, max_new_tokens=NUM_NEW_TOKENS) for prompt in PROMPTS]
        streamed = [pool.submit(stream, server, prompt, max_new_tokens=NUM_NEW_TOKENS) for prompt in PROMPTS]
    for prompt, body, stream_events in zip(PROMPTS, generated, streamed):
        expected, events = body.result()["generated_text"], stream_events.result()
        texts = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
        assert texts == expected == events[-1]["generated_text"], prompt
        assert "\ufffd" not in "".join(e["token"]["text"] for e in events)
        assert all(e["generated_text"] is None for e in events[:-1])


def test_concurrent_requests_get_their_solo_tokens(server: LaunchedServer, reference: dict[str, list[int]]) -> None:
    """16 concurrent requests with different max_new_tokens each get exactly the first max_new_tokens
    of transformers' greedy ids for their prompt: what one request alone gets
    (test_greedy_equals_transformers), whatever shares its batch."""
    jobs = [(PROMPTS[i % len(PROMPTS)], 2 + 2 * i) for i in range(16)]  # 2 to NUM_NEW_TOKENS tokens
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda job: generate(server, job[0], max_new_tokens=job[1]), jobs))
    for (prompt, max_new_tokens), body in zip(jobs, results):
        assert [token["id"] for token in body["details"]["tokens"]] == reference[prompt][:max_new_tokens], \
            (prompt, max_new_tokens)


def test_short_request_finishes_first(server: LaunchedServer) -> None:
    """A short request sent while a long one streams finishes before it (continuous batching)."""
    response = requests.post(server.url + "/generate_stream", stream=True, timeout=120, json={
        "inputs": PROMPTS[1], "parameters": {"max_new_tokens": 64, "ignore_eos": True}})
    assert response.status_code == 200, response.text
    long_events = (line for line in response.iter_lines(decode_unicode=True) if line.startswith("data:"))
    next(long_events)  # the long one runs
    short = generate(server, PROMPTS[0], max_new_tokens=5, ignore_eos=True)
    assert short["details"]["generated_tokens"] == 5
    assert stats(server).num_running == 1  # the long one, still far from its 64th token
    final = json.loads(list(long_events)[-1][len("data:"):])
    assert final["details"]["generated_tokens"] == 64


def test_stop_sequence(server: LaunchedServer) -> None:
    """A stop sequence ends generation with stop_sequence and nothing is streamed after it."""
    full = generate(server, PROMPTS[0], max_new_tokens=NUM_NEW_TOKENS)["generated_text"]
    stop = full.split()[2]  # a word well inside the greedy output
    events = stream(server, PROMPTS[0], max_new_tokens=NUM_NEW_TOKENS, stop=[stop])
    final = events[-1]
    assert final["details"]["finish_reason"] == "stop_sequence"
    assert final["generated_text"].endswith(stop)
    assert full.startswith(final["generated_text"])
    assert "".join(e["token"]["text"] for e in events) == final["generated_text"]


def test_disconnect_leaves_batch(server: LaunchedServer) -> None:
    """A client that disconnects mid-stream leaves the batch (Stats show nothing running)."""
    response = requests.post(server.url + "/generate_stream", stream=True, timeout=60, json={
        "inputs": PROMPTS[1], "parameters": {"max_new_tokens": 1000, "ignore_eos": True}})
    lines = response.iter_lines()
    for _ in range(3):
        next(lines)
    assert stats(server).num_running == 1
    response.close()
    deadline = time.monotonic() + 10
    while stats(server).num_running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats(server).num_running == 0


def test_overload_gets_429(server: LaunchedServer, request: pytest.FixtureRequest) -> None:
    """max_concurrent_requests + 1 concurrent requests: the extra one gets 429 at once (the
    scheduler's admission, whatever the worker's batching mode: checked in the default one)."""
    if request.node.callspec.id != "one-at-a-time":
        pytest.skip("the scheduler refuses before any batching mode matters: checked once, one-at-a-time")
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 64, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        running = [pool.submit(server.post, "/generate", body) for _ in range(24)]
        deadline = time.monotonic() + 30
        while stats(server).num_running + stats(server).num_queued < 24 and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        extra = server.post("/generate", body)
        assert time.monotonic() - started < 2.0
        assert extra.status_code == 429 and extra.json()["error_type"] == "overloaded"
        assert all(f.result().status_code == 200 for f in running)


@pytest.mark.parametrize("payload, status", [
    (b"{not json", 422),
    (json.dumps({"parameters": {}}).encode(), 422),
    (json.dumps({"inputs": 3}).encode(), 422),
    (json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": -1}}).encode(), 422),
    (json.dumps({"inputs": "hi", "parameters": {"temperature": "hot"}}).encode(), 422),
    (json.dumps({"inputs": "word " * 5000}).encode(), 422),
])
def test_bad_input_gets_4xx_json(server: LaunchedServer, payload: bytes, status: int) -> None:
    """Bad input gets a 4xx TGI error JSON, and the server keeps serving."""
    response = requests.post(server.url + "/generate", data=payload, timeout=30,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] and body["error_type"] == "validation"
    assert generate(server, PROMPTS[0], max_new_tokens=2)["details"]["generated_tokens"] == 2
    assert "restarting" not in server.log
