"""The OpenAPI document of our API, the /docs page, and every route's answers against the document."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import requests
from openapi_spec_validator import validate as validate_spec

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate_response
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps
from tests.gateway.sse_reader import read_events
from ztgi.services.gateway.api_docs import OPENAPI_PATH

ROUTES = ["/", "/generate", "/generate_stream", "/invocations", "/tokenize", "/detokenize", "/health", "/info", "/ping",
          "/metrics", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/{response_id}",
          "/v1/embeddings", "/v1/models", "/v1/models/{model_id}", "/v1/load_lora_adapter",
          "/v1/unload_lora_adapter", "/v1/messages", "/v1/messages/count_tokens", "/docs",
          "/api-doc/openapi.json"]
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def document() -> dict:
    with open(OPENAPI_PATH) as f:
        return json.load(f)


def test_document_is_valid_openapi(document: dict) -> None:
    """The shipped document passes openapi-spec-validator and lists every route we serve."""
    validate_spec(document)
    assert document["openapi"].startswith("3.") and list(document["paths"]) == ROUTES


def test_document_is_served(gateway: GatewayProcess, document: dict) -> None:
    """GET /api-doc/openapi.json answers the shipped document."""
    response = requests.get(gateway.url + "/api-doc/openapi.json", timeout=5)
    assert response.status_code == 200 and response.json() == document


def test_docs_page_works_offline(gateway: GatewayProcess, document: dict) -> None:
    """/docs is one HTML page with no script and no remote asset, naming every route and schema."""
    response = requests.get(gateway.url + "/docs", timeout=5)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
    page = response.text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page and "@import" not in page
    for path in document["paths"]:
        assert f"<code>{path}</code>" in page
    for name in document["components"]["schemas"]:
        assert f"id='schema-{name}'" in page
    # a nullable reference (anyOf [$ref, null]) shows as a link, not as "any"
    logprobs_row = ("<code>logprobs</code></td><td class='type'>"
                    "<a href='#schema-CompletionLogprobs'>CompletionLogprobs</a> | null")
    assert logprobs_row in page


def post(gateway: GatewayProcess, path: str, body: dict, **kwargs: object) -> requests.Response:
    return requests.post(gateway.url + path, json=body, timeout=5, **kwargs)


def test_tgi_answers_match_the_document(gateway: GatewayProcess, scheduler: ScriptedScheduler, document: dict) -> None:
    """JSON answers, stream events and errors of the TGI routes validate against our document."""
    details = {"max_new_tokens": 2, "details": True, "decoder_input_details": True, "top_n_tokens": 2, "seed": 1}
    for path in ("/", "/invocations"):
        validate_response(document, path, "post", 200,
                          post(gateway, path, {"inputs": "Hi", "parameters": details}).json())
    validate_response(document, "/generate", "post", 200,
                      post(gateway, "/generate", {"inputs": "Hi", "parameters": details}).json())
    sampled = {"max_new_tokens": 2, "details": True, "best_of": 2, "do_sample": True}
    validate_response(document, "/generate", "post", 200,
                      post(gateway, "/generate", {"inputs": "Hi", "parameters": sampled}).json())
    for path, body in (("/generate_stream", {"inputs": "Hi", "parameters": {"top_n_tokens": 1}}),
                       ("/", {"inputs": "Hi", "stream": True})):
        for event in read_events(post(gateway, path, body, stream=True)):
            validate_response(document, path, "post", 200, event, "text/event-stream")
    bad = post(gateway, "/generate", {"inputs": "Hi", "parameters": {"top_k": -1}})
    validate_response(document, "/generate", "post", bad.status_code, bad.json())
    too_large = requests.post(gateway.url + "/", data=b"x" * 70_000, timeout=5)
    validate_response(document, "/", "post", too_large.status_code, too_large.json())
    validate_response(document, "/info", "get", 200, requests.get(gateway.url + "/info", timeout=5).json())
    scheduler.health = (False, "no worker")
    unhealthy = requests.get(gateway.url + "/health", timeout=5)
    validate_response(document, "/health", "get", unhealthy.status_code, unhealthy.json())


def test_openai_answers_match_the_document(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                           document: dict) -> None:
    """Chat and completion answers, chunks, the model list and /v1 errors validate against our document."""
    chat = post(gateway, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 1, "n": 2}).json()
    validate_response(document, "/v1/chat/completions", "post", 200, chat)
    stream = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
                  stream=True)
    chunks = [json.loads(line[5:]) for line in stream.iter_lines()
              if line.startswith(b"data:") and b"[DONE]" not in line]
    for chunk in chunks:
        validate_response(document, "/v1/chat/completions", "post", 200, chunk, "text/event-stream")
    completion = post(gateway, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2, "logprobs": 1}).json()
    validate_response(document, "/v1/completions", "post", 200, completion)
    assert completion["choices"][0]["logprobs"]["top_logprobs"] == [{"t0": -1.0}, {"t0": -1.0}]
    for logprobs in (0, 2):
        body = {"prompt": "a", "max_tokens": 2, "logprobs": logprobs, "stream": True,
                "stream_options": {"include_usage": True}}
        lines = post(gateway, "/v1/completions", body, stream=True).iter_lines()
        for chunk in [json.loads(line[5:]) for line in lines if line.startswith(b"data:") and b"[DONE]" not in line]:
            validate_response(document, "/v1/completions", "post", 200, chunk, "text/event-stream")
    validate_response(document, "/v1/models", "get", 200, requests.get(gateway.url + "/v1/models", timeout=5).json())
    bad = post(gateway, "/v1/completions", {"prompt": "a", "temperature": -1})
    assert bad.status_code == 422
    validate_response(document, "/v1/completions", "post", 422, bad.json())


def test_lora_answers_match_the_document(gateway: GatewayProcess, scheduler: ScriptedScheduler, document: dict,
                                        tmp_path: pathlib.Path) -> None:
    """Load and unload answers and errors, the model list and Info with an adapter validate against our document."""
    for path, body, status in (("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(tmp_path)}, 200),
                               ("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(tmp_path)}, 409),
                               ("/v1/load_lora_adapter", {"lora_name": "sql"}, 400)):
        response = post(gateway, path, body)
        assert response.status_code == status, response.text
        media_type = "text/plain" if status == 200 else "application/json"
        validate_response(document, path, "post", status, response.text if status == 200 else response.json(),
                          media_type)
    models = requests.get(gateway.url + "/v1/models", timeout=5).json()
    assert [model["id"] for model in models["data"]] == ["test/tiny", "sql"]
    validate_response(document, "/v1/models", "get", 200, models)
    validate_response(document, "/v1/models/{model_id}", "get", 200,
                      requests.get(gateway.url + "/v1/models/sql", timeout=5).json())
    validate_response(document, "/info", "get", 200, requests.get(gateway.url + "/info", timeout=5).json())
    for body, status in (({"lora_name": "sql"}, 200), ({"lora_name": "sql"}, 404), ({}, 400)):
        response = post(gateway, "/v1/unload_lora_adapter", body)
        assert response.status_code == status, response.text
        validate_response(document, "/v1/unload_lora_adapter", "post", status,
                          response.text if status == 200 else response.json(),
                          "text/plain" if status == 200 else "application/json")


def test_errors_in_streams_match_the_document(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                              document: dict) -> None:
    """An error after the first token is a last event the document allows; one before it is a JSON answer."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker lost", "generation", after_texts=[" a"])
    for path, body in (("/generate_stream", {"inputs": "Hi"}), ("/v1/chat/completions", {**CHAT, "stream": True})):
        events = [json.loads(line[5:]) for line in post(gateway, path, body, stream=True).iter_lines()
                  if line.startswith(b"data:")]
        assert events[-1] == {"error": "worker lost", "error_type": "generation"}
        for event in events:
            validate_response(document, path, "post", 200, event, "text/event-stream")
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    for path, body in (("/generate_stream", {"inputs": "Hi"}), ("/v1/chat/completions", {**CHAT, "stream": True})):
        response = post(gateway, path, body)
        assert response.status_code == 429
        validate_response(document, path, "post", 429, response.json())
