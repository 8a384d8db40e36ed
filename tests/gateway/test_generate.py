"""POST /generate and POST / (non-streaming): TGI's JSON shapes, headers and error statuses."""

from __future__ import annotations

import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps
from ztgi.common.messages import Generate


def post(gateway: GatewayProcess, path: str, body: dict) -> requests.Response:
    return requests.post(gateway.url + path, json=body, timeout=10)


def test_generate_returns_text_only_without_details(gateway: GatewayProcess, schemas: dict) -> None:
    """Without details, /generate answers {"generated_text"} and nothing else."""
    response = post(gateway, "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 3}})
    assert response.status_code == 200
    assert response.json() == {"generated_text": " a b c"}
    validate(response.json(), "GenerateResponse", schemas)


def test_generate_details_match_tgi_schema(gateway: GatewayProcess, schemas: dict) -> None:
    """details + decoder_input_details + top_n_tokens give TGI's Details, schema-valid."""
    parameters = {"max_new_tokens": 2, "details": True, "decoder_input_details": True,
                  "top_n_tokens": 2, "seed": 5}
    body = post(gateway, "/generate", {"inputs": "Hi", "parameters": parameters}).json()
    validate(body, "GenerateResponse", schemas)
    details = body["details"]
    assert (details["finish_reason"], details["generated_tokens"], details["seed"]) == ("length", 2, 5)
    assert [t["text"] for t in details["tokens"]] == [" a", " b"]
    assert details["tokens"][0] == {"id": 100, "text": " a", "logprob": -0.5, "special": False}
    assert details["prefill"][0] == {"id": 1, "text": "<s>", "logprob": None}  # NaN becomes null
    assert [len(top) for top in details["top_tokens"]] == [2, 2]


def test_generate_passes_parameters_to_the_scheduler(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """JSON parameters arrive as GenerateParameters in the Generate message."""
    parameters = {"max_new_tokens": 2, "temperature": 0.5, "top_k": 10, "top_p": 0.9, "do_sample": True,
                  "stop": ["\n"], "repetition_penalty": 1.1, "truncate": 100, "watermark": True,
                  "best_of": 1, "grammar": None, "adapter_id": None, "presence_penalty": 0.5}
    post(gateway, "/generate", {"inputs": "Hi", "parameters": parameters, "add_special_tokens": False})
    sent = scheduler.messages(Generate)[-1].parameters
    assert (sent.max_new_tokens, sent.temperature, sent.top_k, sent.top_p, sent.do_sample) == (2, 0.5, 10, 0.9, True)
    assert (sent.stop, sent.repetition_penalty, sent.truncate, sent.watermark) == (["\n"], 1.1, 100, True)
    assert sent.add_special_tokens is False
    assert sent.presence_penalty == 0.5  # OpenAI's, accepted as an extension


def test_generate_sets_tgi_timing_headers(gateway: GatewayProcess) -> None:
    """x-compute-type, x-total-time, x-prompt-tokens, x-generated-tokens come with /generate."""
    response = post(gateway, "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 3}})
    headers = response.headers
    assert headers["x-compute-type"] == "ztgi"
    assert (headers["x-prompt-tokens"], headers["x-generated-tokens"]) == ("2", "3")
    assert int(headers["x-total-time"]) >= 0 and headers["x-compute-characters"] == "2"


def test_return_full_text_prepends_the_prompt(gateway: GatewayProcess) -> None:
    """return_full_text: generated_text starts with the inputs."""
    body = post(gateway, "/generate", {"inputs": "Say:", "parameters": {"max_new_tokens": 2,
                                                                         "return_full_text": True}}).json()
    assert body == {"generated_text": "Say: a b"}


def test_compat_route_wraps_the_answer_in_a_list(gateway: GatewayProcess, schemas: dict) -> None:
    """POST / without stream answers [GenerateResponse], as TGI does for api-inference."""
    response = post(gateway, "/", {"inputs": "Hi", "parameters": {"max_new_tokens": 1, "details": True}})
    assert response.status_code == 200
    [body] = response.json()
    validate(body, "GenerateResponse", schemas)
    assert body["generated_text"] == " a"


def test_overloaded_scheduler_gives_429(gateway: GatewayProcess, scheduler: ScriptedScheduler, schemas: dict) -> None:
    """An overloaded error event from the scheduler is HTTP 429 with error_type overloaded."""
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    response = post(gateway, "/generate", {"inputs": "Hi"})
    assert response.status_code == 429
    assert response.json() == {"error": "Model is overloaded", "error_type": "overloaded"}
    validate(response.json(), "ErrorResponse", schemas)


def test_generation_error_gives_424(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """An error during generation is HTTP 424 with error_type generation."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker lost", "generation", after_texts=[" a"])
    response = post(gateway, "/generate", {"inputs": "Hi"})
    assert response.status_code == 424
    assert response.json() == {"error": "worker lost", "error_type": "generation"}


def test_tokenizer_rejection_gives_422(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A validation error from the tokenizer (e.g. too many tokens) is HTTP 422."""
    error = "`inputs` must have less than 4095 tokens. Given: 5000"
    scheduler.script = lambda g: error_steps(g.request_id, error, "validation")
    response = post(gateway, "/generate", {"inputs": "Hi"})
    assert response.status_code == 422 and response.json()["error"] == error


def test_unknown_route_is_a_json_404(gateway: GatewayProcess) -> None:
    """Unknown paths answer JSON errors too."""
    response = requests.get(gateway.url + "/nope", timeout=5)
    assert response.status_code == 404 and response.json()["error_type"] == "not_found"
