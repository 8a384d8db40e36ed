"""Our OpenAPI document against a launched pipeline (tiny model): the served document is valid, every
route's answers validate against it, and parameters only the pipeline can check are 422 naming the field."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from openapi_spec_validator import validate as validate_spec

from tests.e2e.server import LaunchedServer
from tests.gateway.openapi import validate_response

MAX_INPUT_TOKENS = 32
LONG_TEXT = "word " * 100
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """One launched pipeline on the tiny model with small length limits."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--model-id", tiny_model_dir,
                              "--max-input-tokens", str(MAX_INPUT_TOKENS), "--max-total-tokens", "64",
                              "--max-batch-prefill-tokens", "256")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def document(server: LaunchedServer) -> dict[str, Any]:
    response = server.get("/api-doc/openapi.json")
    assert response.status_code == 200
    return response.json()


def sse_events(response: requests.Response) -> list[Any]:
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    return [json.loads(line[5:]) for line in response.iter_lines()
            if line.startswith(b"data:") and line != b"data: [DONE]"]


def check(document: dict[str, Any], path: str, method: str, response: requests.Response) -> None:
    """The answer's status is declared for the route, and its JSON body matches the declared schema."""
    assert str(response.status_code) in document["paths"][path][method]["responses"], (path, response.text)
    if response.headers.get("Content-Type", "").startswith("application/json"):
        validate_response(document, path, method, response.status_code, response.json())


def test_served_document_is_valid(document: dict[str, Any]) -> None:
    """GET /api-doc/openapi.json passes openapi-spec-validator."""
    validate_spec(document)


def test_tgi_routes_answer_as_documented(server: LaunchedServer, document: dict[str, Any]) -> None:
    """/, /generate, /generate_stream, /invocations, /tokenize, /info, /health, /ping, /metrics, /docs."""
    details = {"max_new_tokens": 3, "details": True, "decoder_input_details": True, "top_n_tokens": 2}
    for path in ("/", "/generate", "/invocations"):
        check(document, path, "post", server.post(path, {"inputs": "Hello", "parameters": details}))
    best_of = {"max_new_tokens": 3, "details": True, "best_of": 2, "do_sample": True}
    answer = server.post("/generate", {"inputs": "Hello", "parameters": best_of})
    check(document, "/generate", "post", answer)
    assert len(answer.json()["details"]["best_of_sequences"]) == 1
    for path, body in (("/generate_stream", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}}),
                       ("/", {"inputs": "Hello", "stream": True, "parameters": {"max_new_tokens": 3}})):
        for event in sse_events(server.post(path, body, stream=True)):
            validate_response(document, path, "post", 200, event, "text/event-stream")
    check(document, "/tokenize", "post", server.post("/tokenize", {"inputs": "Hello world"}))
    for path in ("/info", "/health", "/ping", "/metrics", "/docs"):
        check(document, path, "get", server.get(path))


def test_openai_routes_answer_as_documented(server: LaunchedServer, document: dict[str, Any]) -> None:
    """/v1/chat/completions and /v1/completions (whole and streamed) and /v1/models."""
    check(document, "/v1/chat/completions", "post",
          server.post("/v1/chat/completions", {**CHAT, "n": 2, "logprobs": True}))
    check(document, "/v1/completions", "post",
          server.post("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3, "logprobs": 2}))
    check(document, "/v1/models", "get", server.get("/v1/models"))
    model_id = server.get("/v1/models").json()["data"][0]["id"]
    check(document, "/v1/models/{model_id}", "get", server.get("/v1/models/" + model_id.replace("/", "%2F")))
    check(document, "/v1/models/{model_id}", "get", server.get("/v1/models/no-such-model"))
    check(document, "/v1/completions", "post",  # an evaluation harness's request: the prompt's logprobs too
          server.post("/v1/completions", {"prompt": [[1, 2, 3]], "max_tokens": 1, "logprobs": 1, "echo": True}))
    check(document, "/detokenize", "post", server.post("/detokenize", {"tokens": [1, 2, 3]}))
    check(document, "/detokenize", "post", server.post("/detokenize", {"tokens": [10**9]}))
    for path, body in (("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
                       ("/v1/completions", {"prompt": "a", "max_tokens": 3, "logprobs": 1,
                                            "stream_options": {"include_usage": True}})):
        for chunk in sse_events(server.post(path, {**body, "stream": True}, stream=True)):
            validate_response(document, path, "post", 200, chunk, "text/event-stream")


def test_embeddings_answer_as_documented(server: LaunchedServer, document: dict[str, Any]) -> None:
    """/v1/embeddings in floats and base64, and its refusals: a bad field, another model, too long."""
    model_id = server.get("/v1/models").json()["data"][0]["id"]
    for body in ({"input": ["a", "b c"]}, {"input": [[1, 2, 3]], "encoding_format": "base64"},
                 {"input": "a", "encoding_format": "int8"}, {"input": LONG_TEXT}):
        check(document, "/v1/embeddings", "post", server.post("/v1/embeddings", {"model": model_id, **body}))
    check(document, "/v1/embeddings", "post", server.post("/v1/embeddings", {"model": "gpt2", "input": "a"}))
    too_long = server.post("/v1/embeddings", {"model": model_id, "input": LONG_TEXT}).json()["error"]["message"]
    assert f"longer than the {MAX_INPUT_TOKENS} tokens" in too_long and "truncate_prompt_tokens" in too_long


@pytest.mark.parametrize("path,body,field", [
    ("/generate", {"inputs": LONG_TEXT, "parameters": {"max_new_tokens": 1}}, "max_new_tokens"),
    ("/generate", {"inputs": LONG_TEXT, "parameters": {"max_new_tokens": 1, "truncate": 100}}, "truncate"),
    ("/generate_stream", {"inputs": "Hello " * 20, "parameters": {"max_new_tokens": 50}}, "max_new_tokens"),
    ("/", {"inputs": "Hello", "parameters": {"max_new_tokens": 100}}, "max_new_tokens"),
    ("/v1/completions", {"prompt": LONG_TEXT, "max_tokens": 1}, "max_new_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 1}, "max_new_tokens"),
])
def test_lengths_checked_by_the_pipeline_are_422(server: LaunchedServer, document: dict[str, Any], path: str,
                                                  body: dict, field: str) -> None:
    """Prompts too long for the limits (known only once tokenized) are 422 naming the field, as documented."""
    response = server.post(path, body)
    assert response.status_code == 422, response.text
    check(document, path, "post", response)
    error = response.json()["error"]
    assert field in (error["message"] if path.startswith("/v1/") else error)


def test_too_long_input_names_inputs(server: LaunchedServer) -> None:
    """An input over max_input_tokens (with room in the total) is 422 naming `inputs`."""
    response = server.post("/generate", {"inputs": "Hello " * 40, "parameters": {"max_new_tokens": 1}})
    assert response.status_code == 422 and "inputs" in response.json()["error"]



def test_lora_routes_answer_as_documented(server: LaunchedServer, document: dict[str, Any],
                                          tmp_path: pathlib.Path) -> None:
    """With no adapter loaded: /info and /v1/models show none; the scheduler refuses a path with no adapter
    (400), an unknown name to unload (404) and an unknown `adapter_id` (422); an OpenAI `model` naming no
    adapter is the base model."""
    info = server.get("/info").json()
    assert (info["lora_adapters"], info["max_loras"], info["max_lora_rank"]) == ([], 4, 64)
    assert len(server.get("/v1/models").json()["data"]) == 1
    for path in (tmp_path / "missing", tmp_path):  # no directory; a directory with no adapter_config.json
        response = server.post("/v1/load_lora_adapter", {"lora_name": "no-such-adapter", "lora_path": str(path)})
        assert response.status_code == 400, response.text
        check(document, "/v1/load_lora_adapter", "post", response)
    response = server.post("/v1/unload_lora_adapter", {"lora_name": "no-such-adapter"})
    assert response.status_code == 404, response.text
    check(document, "/v1/unload_lora_adapter", "post", response)
    response = server.post("/generate", {"inputs": "Hello",
                                         "parameters": {"max_new_tokens": 1, "adapter_id": "no-such-adapter"}})
    assert response.status_code == 422 and "no-such-adapter" in response.json()["error"], response.text
    check(document, "/generate", "post", response)
    response = server.post("/v1/completions", {"model": "no-such-adapter", "prompt": "Hi", "max_tokens": 1})
    assert response.status_code == 200, response.text
    check(document, "/v1/completions", "post", response)
