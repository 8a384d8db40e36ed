"""Bad requests: 422 naming the field for every kind of bad input, 413 for oversized bodies."""

from __future__ import annotations

import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler
from ztgi.common.messages import Generate

BAD_BODIES = [
    # (body, route, a word the error must contain)
    ('{"inputs": "Hi"', "/generate", "JSON"),
    ('["Hi"]', "/generate", "object"),
    ('{"parameters": {}}', "/generate", "inputs"),
    ('{"inputs": 5}', "/generate", "inputs"),
    ('{"inputs": ""}', "/generate", "inputs"),
    ('{"inputs": "Hi", "parameters": []}', "/generate", "parameters"),
    ('{"inputs": "Hi", "parameters": {"temperature": "hot"}}', "/generate", "temperature"),
    ('{"inputs": "Hi", "parameters": {"temperature": -1}}', "/generate", "temperature"),
    ('{"inputs": "Hi", "parameters": {"max_new_tokens": 2.5}}', "/generate", "max_new_tokens"),
    ('{"inputs": "Hi", "parameters": {"max_new_tokens": 0}}', "/generate", "max_new_tokens"),
    ('{"inputs": "Hi", "parameters": {"max_new_tokens": 1e30}}', "/generate", "max_new_tokens"),
    ('{"inputs": "Hi", "parameters": {"seed": 100000000000000000000000}}', "/generate", "seed"),
    ('{"inputs": "Hi", "parameters": {"top_p": 1.5}}', "/generate", "top_p"),
    ('{"inputs": "Hi", "parameters": {"top_k": 0}}', "/generate", "top_k"),
    ('{"inputs": "Hi", "parameters": {"do_sample": "yes"}}', "/generate", "do_sample"),
    ('{"inputs": "Hi", "parameters": {"stop": "\\n"}}', "/generate", "stop"),
    ('{"inputs": "Hi", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}', "/generate", "stop"),
    ('{"inputs": "Hi", "parameters": {"top_n_tokens": 6}}', "/generate", "top_n_tokens"),
    ('{"inputs": "Hi", "parameters": {"truncate": 0}}', "/generate", "truncate"),
    ('{"inputs": "Hi", "parameters": {"best_of": 3}}', "/generate", "best_of"),
    ('{"inputs": "Hi", "parameters": {"best_of": 2}}', "/generate_stream", "best_of"),
    ('{"inputs": "Hi", "parameters": {"decoder_input_details": true}}', "/generate_stream", "decoder_input_details"),
    ('{"inputs": "Hi", "parameters": {"grammar": {"type": "xml", "value": {}}}}', "/generate", "grammar"),
    ('{"inputs": "Hi", "parameters": {"grammar": {"type": "json", "value": "{"}}}', "/generate", "grammar"),
    ('{"inputs": "Hi", "parameters": {"grammar": {"type": "regex", "value": 5}}}', "/generate", "grammar"),
    ('{"inputs": "Hi", "parameters": {"grammar": {"type": "json"}}}', "/generate_stream", "grammar"),
    ('{"inputs": "Hi", "parameters": {"grammar": "json"}}', "/generate", "grammar"),
    ('{"inputs": "Hi", "stream": "yes"}', "/", "stream"),
    ('{"inputs": "Hi", "parameters": {"temperature": 0}}', "/", "temperature"),
    ('{"inputs": "Hi", "parameters": {"typical_p": 1.0}}', "/generate", "typical_p"),
    ('{"inputs": "Hi", "parameters": {"typical_p": 0}}', "/invocations", "typical_p"),
    ('{"inputs": "Hi", "parameters": {"repetition_penalty": 0}}', "/generate", "repetition_penalty"),
    ('{"inputs": "Hi", "parameters": {"repetition_penalty": -1.5}}', "/generate_stream", "repetition_penalty"),
    ('{"inputs": "Hi", "parameters": {"frequency_penalty": 2.5}}', "/generate", "frequency_penalty"),
    ('{"inputs": "Hi", "parameters": {"frequency_penalty": -3}}', "/generate", "frequency_penalty"),
    ('{"inputs": "Hi", "parameters": {"presence_penalty": 2.5}}', "/generate", "presence_penalty"),
    ('{"inputs": "Hi", "parameters": {"max_new_tokens": -5}}', "/generate", "max_new_tokens"),
    ('{"inputs": "Hi", "parameters": {"seed": -1}}', "/generate", "seed"),
    ('{"inputs": "Hi", "parameters": {"top_n_tokens": -1}}', "/generate", "top_n_tokens"),
    ('{"inputs": "Hi", "parameters": {"truncate": 5000}}', "/generate", "truncate"),
    ('{"inputs": "Hi", "parameters": {"stop": [""]}}', "/generate", "stop"),
    ('{"inputs": "Hi", "parameters": {"watermark": 1}}', "/generate", "watermark"),
    ('{"inputs": "Hi", "parameters": {"details": "true"}}', "/generate", "details"),
    ('{"inputs": "Hi", "parameters": {"top_k": 2.5}}', "/generate", "top_k"),
    ('{"inputs": "Hi", "parameters": {"best_of": 2, "seed": 1, "do_sample": true}}', "/generate", "seed"),
    ('{"inputs": "Hi", "parameters": {"best_of": 2}}', "/generate", "sampling"),
]


@pytest.mark.parametrize("body,route,field", BAD_BODIES, ids=[f"{r}:{b[:40]}" for b, r, _ in BAD_BODIES])
def test_bad_input_is_422_naming_the_field(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                           schemas: dict, body: str, route: str, field: str) -> None:
    """Each kind of bad body is refused with 422, error_type validation, and names what is wrong."""
    response = requests.post(gateway.url + route, data=body, headers={"Content-Type": "application/json"},
                             timeout=5)
    assert response.status_code == 422, response.text
    error = response.json()
    validate(error, "ErrorResponse", schemas)
    assert error["error_type"] == "validation" and field in error["error"]
    assert not scheduler.messages(Generate)  # nothing reached the scheduler


def test_body_over_the_limit_is_413_before_parsing(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A body larger than --max-payload-bytes is 413, even with no valid JSON in it."""
    response = requests.post(gateway.url + "/generate", data=b"x" * 70_000, timeout=5)
    assert response.status_code == 413
    assert "65536" in response.json()["error"]


def test_chunked_body_over_the_limit_is_413(gateway: GatewayProcess) -> None:
    """A chunked body (no Content-Length) over the limit is 413 too."""
    chunks = (b'{"inputs": "' + b"x" * 10_000 for _ in range(10))
    response = requests.post(gateway.url + "/generate", data=chunks, timeout=5)
    assert response.status_code == 413


def test_null_parameters_mean_defaults(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """huggingface_hub sends every parameter, null when unset: all nulls are accepted as defaults."""
    parameters = {name: None for name in (
        "adapter_id", "best_of", "decoder_input_details", "details", "do_sample", "frequency_penalty",
        "grammar", "max_new_tokens", "repetition_penalty", "return_full_text", "seed", "stop",
        "temperature", "top_k", "top_n_tokens", "top_p", "truncate", "typical_p", "watermark")}
    response = requests.post(gateway.url + "/", json={"inputs": "Hi", "parameters": parameters, "stream": False},
                             timeout=5)
    assert response.status_code == 200, response.text
    assert scheduler.messages(Generate)[-1].parameters.max_new_tokens is None
