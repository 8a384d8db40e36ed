"""/tokenize and /metrics against a launched pipeline (tiny model): a tokenizer answers
/tokenize through the scheduler, and every tier's figures move after real requests."""

from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from tests.e2e.server import LaunchedServer
from tests.gateway.openapi import load_schemas, validate
from ztgi.common.client.sync_client import ZtgiClient

TEXT = "Hello world, ça va? 😀"
Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def server(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    """One launched pipeline on the tiny model (1 worker, 1 tokenizer, 1 gateway)."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", tiny_model_dir,
                              "--max-input-tokens", "256", "--max-total-tokens", "512",
                              "--max-batch-prefill-tokens", "512")
    yield launched
    assert launched.stop() == 0, launched.log


def scrape(server: LaunchedServer) -> Samples:
    response = server.get("/metrics")
    assert response.status_code == 200, response.text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_tokenize_answers_tgi_shape_from_a_tokenizer(server: LaunchedServer, tiny_model_dir: str) -> None:
    """POST /tokenize: the tokenizer's ids, each with inputs[start:stop] as text; truncate keeps the last."""
    response = server.post("/tokenize", {"inputs": TEXT})
    assert response.status_code == 200, response.text
    tokens = response.json()
    validate(tokens, "TokenizeResponse", load_schemas())
    assert [t["id"] for t in tokens] == AutoTokenizer.from_pretrained(tiny_model_dir).encode(TEXT)
    assert all(t["text"] == TEXT[t["start"]:t["stop"]] for t in tokens)
    truncated = server.post("/tokenize", {"inputs": TEXT, "parameters": {"truncate": 2},
                                          "add_special_tokens": False})
    assert truncated.json() == tokens[-2:]
    empty = server.post("/tokenize", {"inputs": ""})
    assert empty.status_code == 422 and empty.json()["error_type"] == "validation"


def test_vllm_tokenize_and_detokenize_forms(server: LaunchedServer, tiny_model_dir: str) -> None:
    """vLLM's /tokenize ({"prompt"} and {"messages"}) and /detokenize ({"tokens"}) beside TGI's form."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    answer = server.post("/tokenize", {"model": "any", "prompt": TEXT, "return_token_strs": True}).json()
    ids = tokenizer.encode(TEXT)
    assert answer == {"count": len(ids), "max_model_len": 512, "tokens": ids,
                      "token_strs": [t["text"] for t in server.post("/tokenize", {"inputs": TEXT}).json()]}
    chat = [{"role": "user", "content": "Hi"}]
    by_messages = server.post("/tokenize", {"model": "any", "messages": chat}).json()
    chat_prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert by_messages["tokens"] == tokenizer.encode(chat_prompt, add_special_tokens=False)
    assert by_messages["token_strs"] is None
    detokenized = server.post("/detokenize", {"model": "any", "tokens": ids})
    assert detokenized.status_code == 200 and detokenized.json() == {"prompt": TEXT}
    for path, body in (("/detokenize", {"tokens": [49152]}), ("/detokenize", {"tokens": []}),
                       ("/detokenize", {"tokens": "1"}), ("/tokenize", {"prompt": ""}),
                       ("/tokenize", {"prompt": "a", "messages": chat}), ("/tokenize", {"messages": []})):
        refused = server.post(path, body)
        assert refused.status_code == 422, (path, body, refused.text)
    assert server.get("/health").status_code == 200


def test_direct_client_tokenizes_through_the_scheduler(server: LaunchedServer) -> None:
    """ZtgiClient.tokenize gets the same tokens as HTTP, over ZMQ."""
    with ZtgiClient(server.scheduler_url) as client:
        tokens = client.tokenize("Hello world")
    assert [(t.text, t.start, t.stop) for t in tokens] == [("Hello", 0, 5), (" world", 5, 11)]


def test_metrics_move_across_the_pipeline(server: LaunchedServer) -> None:
    """After /generate and /generate_stream, gateway and scheduler counters and histograms all move."""
    before = scrape(server)
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "details": True}}
    generated = server.post("/generate", body).json()["details"]["generated_tokens"]
    stream = requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=60)
    events = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith(b"data:")]
    generated += events[-1]["details"]["generated_tokens"]
    after = scrape(server)
    assert moved(before, after, "tgi_request_count_total") == 2
    assert moved(before, after, "tgi_request_success_total") == 2
    assert moved(before, after, "ztgi_time_to_first_token_seconds_count") == 2
    assert moved(before, after, "ztgi_inter_token_latency_seconds_count") == generated - 2
    assert moved(before, after, "ztgi_generated_tokens_total") == generated
    assert moved(before, after, "ztgi_requests_finished_total") == 2
    assert moved(before, after, "tgi_batch_inference_count_total", method="prefill") == 2
    assert moved(before, after, "tgi_batch_inference_duration_count", method="decode") == generated - 2
    for name in ("tgi_request_validation_duration_count", "tgi_request_queue_duration_count",
                 "tgi_request_inference_duration_count"):
        assert moved(before, after, name) == 2, name
    assert after[("ztgi_workers", frozenset())] == 1 and after[("ztgi_tokenizers", frozenset())] == 1
    assert after[("ztgi_scheduler_up", frozenset())] == 1


def test_paged_pool_in_info_and_metrics(server: LaunchedServer) -> None:
    """The default paged worker's pool: /info names the layout, block size and count, and the
    block gauges add up (every block free again once the requests are done)."""
    info = server.get("/info").json()
    assert (info["kv_cache"], info["block_size"]) == ("paged", 16) and info["num_blocks"] > 0
    assert (info["quantize"], info["draft_model_id"]) == ("none", None)
    server.post("/generate", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
    metrics = scrape(server)
    total = sum(v for (name, _), v in metrics.items() if name == "ztgi_kv_blocks_total")
    free = sum(v for (name, _), v in metrics.items() if name == "ztgi_kv_blocks_free")
    assert total == info["num_blocks"] == free
