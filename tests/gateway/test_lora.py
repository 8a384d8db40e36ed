"""LoRA adapters through a real gateway on the scripted scheduler: TGI's `adapter_id` and OpenAI's
`model` reach the scheduler in the parameters; vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter check their bodies (400, nothing sent down) and map the scheduler's
refusals to 400/404/409; /v1/models and /info list the adapters."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler, default_script, error_steps
from tests.gateway.sse_reader import read_events
from ztgi.common.messages import Generate, LoadAdapter, UnloadAdapter

CHAT: Any = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


def post(gateway: GatewayProcess, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(gateway.url + path, json=body, timeout=5, **kwargs)


def sent(scheduler: ScriptedScheduler) -> tuple[str | None, str | None]:
    parameters = scheduler.messages(Generate)[-1].parameters
    return parameters.adapter_id, parameters.model


def refuse_unknown_adapters(scheduler: ScriptedScheduler) -> None:
    """As the scheduler does: a request naming an adapter it does not hold is a validation error."""
    def script(generate: Generate) -> list:
        adapter_id = generate.parameters.adapter_id
        if adapter_id is not None and adapter_id not in scheduler.adapter_to_path:
            return error_steps(generate.request_id, f"no LoRA adapter named `{adapter_id}`", "validation")
        return default_script(generate)
    scheduler.script = script


# -- request fields ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/generate", "/generate_stream", "/", "/invocations"])
def test_adapter_id_reaches_the_scheduler(gateway: GatewayProcess, scheduler: ScriptedScheduler, path: str) -> None:
    """TGI's `parameters.adapter_id` travels as GenerateParameters.adapter_id on every generate route."""
    response = post(gateway, path, {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "adapter_id": "sql"}})
    assert response.status_code == 200, response.text
    assert sent(scheduler) == ("sql", None)


def test_best_of_candidates_all_use_the_adapter(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """Each best_of candidate is generated with the request's adapter."""
    parameters = {"max_new_tokens": 2, "adapter_id": "sql", "best_of": 2, "do_sample": True}
    assert post(gateway, "/generate", {"inputs": "Hi", "parameters": parameters}).status_code == 200
    assert [g.parameters.adapter_id for g in scheduler.messages(Generate)] == ["sql", "sql"]


def test_unknown_adapter_id_is_the_schedulers_422(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """The scheduler's refusal of an unknown adapter is TGI's validation error (422), whole or streamed."""
    refuse_unknown_adapters(scheduler)
    for path in ("/generate", "/generate_stream"):
        response = post(gateway, path, {"inputs": "Hi", "parameters": {"adapter_id": "nope"}})
        assert response.status_code == 422, response.text
        assert response.json() == {"error": "no LoRA adapter named `nope`", "error_type": "validation"}


def test_openai_model_reaches_the_scheduler(client: openai.OpenAI, gateway: GatewayProcess,
                                            scheduler: ScriptedScheduler) -> None:
    """OpenAI's `model` travels as GenerateParameters.model from chat, completions (whole and streamed),
    responses and Anthropic's messages; the scheduler decides whether it names an adapter."""
    client.chat.completions.create(model="sql", messages=CHAT, max_tokens=1)
    assert sent(scheduler) == (None, "sql")
    list(client.chat.completions.create(model="sql-stream", messages=CHAT, max_tokens=1, stream=True))
    assert sent(scheduler) == (None, "sql-stream")
    client.completions.create(model="code", prompt="One", max_tokens=1)
    assert sent(scheduler) == (None, "code")
    list(client.completions.create(model="code-stream", prompt="One", max_tokens=1, stream=True))
    assert sent(scheduler) == (None, "code-stream")
    client.responses.create(model="chat", input="Hi", max_output_tokens=1)
    assert sent(scheduler) == (None, "chat")
    response = post(gateway, "/v1/messages", {"model": "claude-like", "max_tokens": 1, "messages": CHAT})
    assert response.status_code == 200, response.text
    assert sent(scheduler) == (None, "claude-like")


def test_openai_model_may_be_left_out(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """No `model` (or an empty one) means the base model, as TGI's OpenAI routes allow."""
    for body in ({"messages": CHAT, "max_tokens": 1}, {"model": "", "messages": CHAT, "max_tokens": 1}):
        assert post(gateway, "/v1/chat/completions", body).status_code == 200
        assert sent(scheduler) == (None, None)


@pytest.mark.parametrize("path,body,field", [
    ("/generate", {"inputs": "Hi", "parameters": {"adapter_id": 5}}, "adapter_id"),
    ("/generate_stream", {"inputs": "Hi", "parameters": {"adapter_id": ["a"]}}, "adapter_id"),
    ("/", {"inputs": "Hi", "parameters": {"adapter_id": ""}}, "adapter_id"),
    ("/v1/chat/completions", {"model": 5, "messages": CHAT}, "model"),
    ("/v1/completions", {"model": {"name": "a"}, "prompt": "One"}, "model"),
    ("/v1/responses", {"model": True, "input": "Hi"}, "model"),
], ids=["generate-number", "stream-array", "compat-empty", "chat-number", "completions-object", "responses-bool"])
def test_bad_adapter_names_are_422(gateway: GatewayProcess, scheduler: ScriptedScheduler, path: str, body: dict,
                                   field: str) -> None:
    """An adapter_id or model that is not a (non-empty) string is a 422 naming the field; nothing is sent down."""
    response = post(gateway, path, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert f"`{field}`" in (error["message"] if path.startswith("/v1/") else error)
    assert not scheduler.messages(Generate)


# -- load and unload -----------------------------------------------------------------------------

def test_load_list_use_and_unload(gateway: GatewayProcess, client: openai.OpenAI, scheduler: ScriptedScheduler,
                                  tmp_path: pathlib.Path) -> None:
    """A loaded adapter is listed by /v1/models (after the base) and /info, found by /v1/models/{id}, usable
    by adapter_id; unloaded, it is gone from all three."""
    refuse_unknown_adapters(scheduler)
    response = post(gateway, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(tmp_path),
                                                       "lora_int_id": 7})
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    assert response.text == "Success: LoRA adapter 'sql' added successfully."
    assert scheduler.messages(LoadAdapter)[-1].name == "sql"
    assert scheduler.messages(LoadAdapter)[-1].path == str(tmp_path)
    assert [(m.id, (m.model_extra or {})["parent"]) for m in client.models.list().data] == [("test/tiny", None),
                                                                                            ("sql", "test/tiny")]
    assert (client.models.retrieve("sql").model_extra or {})["root"] == "sql"
    info = requests.get(gateway.url + "/info", timeout=5).json()
    assert (info["lora_adapters"], info["max_loras"], info["max_lora_rank"]) == (["sql"], 4, 64)
    assert post(gateway, "/generate", {"inputs": "Hi", "parameters": {"adapter_id": "sql"}}).status_code == 200

    response = post(gateway, "/v1/unload_lora_adapter", {"lora_name": "sql", "lora_int_id": 7})
    assert response.status_code == 200 and response.text == "Success: LoRA adapter 'sql' removed successfully."
    assert [m.id for m in client.models.list().data] == ["test/tiny"]
    assert requests.get(gateway.url + "/info", timeout=5).json()["lora_adapters"] == []
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("sql")
    assert post(gateway, "/generate", {"inputs": "Hi", "parameters": {"adapter_id": "sql"}}).status_code == 422


@pytest.mark.parametrize("path,body,status,code", [
    ("/v1/load_lora_adapter", {"lora_name": "taken", "lora_path": "{dir}"}, 409, "conflict"),
    ("/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "{dir}/missing"}, 400, "validation"),
    ("/v1/unload_lora_adapter", {"lora_name": "unknown"}, 404, "not_found"),
    ("/v1/unload_lora_adapter", {"lora_name": "busy"}, 409, "conflict"),
], ids=["name-taken", "bad-path", "unknown-name", "in-use"])
def test_scheduler_refusals_keep_their_status(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                              tmp_path: pathlib.Path, path: str, body: dict, status: int,
                                              code: str) -> None:
    """The scheduler's refusal is vLLM's status (bad adapter 400, unknown name 404, taken or in use 409) in
    OpenAI's error shape, with the scheduler's message."""
    scheduler.adapter_to_path.update(taken=str(tmp_path), busy=str(tmp_path))
    scheduler.busy_adapters.add("busy")
    body = {key: value.replace("{dir}", str(tmp_path)) for key, value in body.items()}
    response = post(gateway, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    assert sorted(scheduler.adapter_to_path) == ["busy", "taken"]  # nothing changed


@pytest.mark.parametrize("path,body,words", [
    ("/v1/load_lora_adapter", '{"lora_name": "a"', "JSON"),
    ("/v1/load_lora_adapter", '["a", "b"]', "object"),
    ("/v1/load_lora_adapter", '{"lora_path": "/tmp"}', "missing field `lora_name`"),
    ("/v1/load_lora_adapter", '{"lora_name": "a"}', "missing field `lora_path`"),
    ("/v1/load_lora_adapter", '{"lora_name": 5, "lora_path": "/tmp"}', "`lora_name` must be a non-empty string"),
    ("/v1/load_lora_adapter", '{"lora_name": "a", "lora_path": ""}', "`lora_path` must be a non-empty string"),
    ("/v1/load_lora_adapter", '{"lora_name": "a", "lora_path": "/tmp", "base": "x"}', "unknown field `base`"),
    ("/v1/load_lora_adapter", '{"lora_name": "a", "lora_path": "/tmp", "load_inplace": true}', "load_inplace"),
    ("/v1/unload_lora_adapter", "{}", "missing field `lora_name`"),
    ("/v1/unload_lora_adapter", '{"lora_name": null}', "missing field `lora_name`"),
    ("/v1/unload_lora_adapter", '{"lora_name": ["a"]}', "`lora_name` must be a non-empty string"),
    ("/v1/unload_lora_adapter", '{"lora_name": "a", "lora_path": "/tmp"}', "unknown field `lora_path`"),
])
def test_bad_bodies_are_400_and_reach_nobody(gateway: GatewayProcess, scheduler: ScriptedScheduler, path: str,
                                             body: str, words: str) -> None:
    """Bad JSON, a missing field, a wrong type or an unknown field is a 400 naming it, as vLLM answers;
    the scheduler hears nothing."""
    response = requests.post(gateway.url + path, data=body, headers={"Content-Type": "application/json"},
                             timeout=5)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["code"] == "validation"
    assert not scheduler.messages(LoadAdapter) and not scheduler.messages(UnloadAdapter)


def test_streamed_adapter_request_streams(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                          tmp_path: pathlib.Path) -> None:
    """A stream with a loaded adapter runs like any other."""
    scheduler.adapter_to_path["sql"] = str(tmp_path)
    refuse_unknown_adapters(scheduler)
    events = read_events(post(gateway, "/generate_stream", {"inputs": "Hi", "parameters": {"adapter_id": "sql"}},
                              stream=True))
    assert events[-1]["generated_text"] == " a b c"
