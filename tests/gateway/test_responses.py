"""POST /v1/responses through the gateway with the official `openai` client: what is sent down
(the chat messages, parameters, grammar and tools a Responses request becomes) and how answers
come back, whole and as the named events the SDK's stream reads. Token texts are scripted."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
import requests
from openai.types.responses import Response, ResponseStreamEvent

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate_response
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps, token_steps
from tests.gateway.sse_reader import read_events
from tests.gateway.test_metrics import moved, scrape
from tests.gateway.test_tool_calls import ANSWER, pieces
from ztgi.common.messages import ChatMessage, Generate, ToolCall
from ztgi.services.gateway.api_docs import openapi_document

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ADD = {"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
          "additionalProperties": False}
STREAM_EVENT: pydantic.TypeAdapter = pydantic.TypeAdapter(ResponseStreamEvent)
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
               "response.content_part.done", "response.output_item.done", "response.completed"]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


@pytest.fixture
def ends_itself(scheduler: ScriptedScheduler) -> ScriptedScheduler:
    """Answers " a b" that ends on EOS (a completed response)."""
    scheduler.script = lambda g: token_steps(g.request_id, [" a", " b"], finish_reason="eos_token")
    return scheduler


@pytest.fixture
def two_calls(scheduler: ScriptedScheduler) -> ScriptedScheduler:
    scheduler.script = lambda g: token_steps(g.request_id, pieces(ANSWER), finish_reason="eos_token")
    return scheduler


def test_text_response(client: openai.OpenAI, ends_itself: ScriptedScheduler, gateway: GatewayProcess) -> None:
    """A string input with instructions is a system and a user turn; the answer is one message,
    the request's parameters are echoed, and the raw JSON validates as the SDK's Response."""
    response = client.responses.create(model="any", input="Hi", instructions="Be brief.", max_output_tokens=5,
                                       temperature=0, metadata={"k": "v"})
    assert response.output_text == " a b" and response.status == "completed"
    assert response.id.startswith("resp_") and response.object == "response" and response.model == "test/tiny"
    [message] = response.output
    assert (message.type, message.role, message.status, message.id[:4]) == ("message", "assistant", "completed", "msg_")
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (3, 2, 5)
    assert (response.instructions, response.max_output_tokens, response.temperature, response.metadata) == (
        "Be brief.", 5, 0, {"k": "v"})
    assert response.text.format.type == "text" and response.tool_choice == "auto" and response.tools == []
    sent = ends_itself.messages(Generate)[-1]
    assert sent.messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert (sent.parameters.max_new_tokens, sent.parameters.do_sample, sent.parameters.grammar) == (5, False, None)
    raw = requests.post(gateway.url + "/v1/responses", json={"input": "Hi"}, timeout=5).json()
    assert Response.model_validate(raw).output_text == " a b"


def test_fields_that_ask_for_what_the_server_does_are_accepted(client: openai.OpenAI,
                                                              ends_itself: ScriptedScheduler) -> None:
    """Labels and settings that state this server's own behaviour pass (and are echoed)."""
    response = client.responses.create(model="any", input="Hi", truncation="disabled", background=False,
                                       service_tier="auto", include=[], user="u-1", safety_identifier="s-1",
                                       prompt_cache_key="k-1", store=False)
    assert response.output_text == " a b" and (response.user, response.truncation) == ("u-1", "disabled")


def test_token_limit_makes_an_incomplete_response(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """An answer cut by max_output_tokens is incomplete, with the reason, its message too."""
    response = client.responses.create(model="any", input="Hi", max_output_tokens=3)
    assert response.output_text == " a b c" and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens" and response.output[0].status == "incomplete"


def test_input_items_become_chat_turns(client: openai.OpenAI, ends_itself: ScriptedScheduler) -> None:
    """Messages with text parts, an earlier answer's output items and function call outputs
    become the chat turns the template renders (developer as system, calls as tool_calls)."""
    client.responses.create(model="any", max_output_tokens=2, tools=[WEATHER], input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]},
        {"role": "user", "content": "Thanks"}])
    assert ends_itself.messages(Generate)[-1].messages == [
        ChatMessage("system", "Use tools."), ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", [ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
                                      ToolCall("call_2", "get_weather", '{"city": "Rome"}')]),
        ChatMessage("tool", "sunny", tool_call_id="call_1"), ChatMessage("tool", "rain", tool_call_id="call_2"),
        ChatMessage("assistant", "Sunny and rain."), ChatMessage("user", "Thanks")]


def test_json_schema_format_is_a_grammar(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """text.format json_schema travels as the chat's JSON grammar (strict: exact) and is echoed."""
    response = client.responses.create(model="any", input="Hi", max_output_tokens=2, text={"format": {
        "type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}})
    grammar = scheduler.messages(Generate)[-1].parameters.grammar
    assert grammar.type == "json" and json.loads(grammar.value)["properties"] == SCHEMA["properties"]
    assert response.text.format.type == "json_schema" and response.text.format.name == "person"
    client.responses.create(model="any", input="Hi", max_output_tokens=2, text={"format": {"type": "json_object"}})
    assert json.loads(scheduler.messages(Generate)[-1].parameters.grammar.value) == {"type": "object"}


def test_function_calls_are_output_items(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """An answer of two calls is two function_call items with distinct call ids; the tools
    travel as tools and a grammar, a named tool_choice allows only that function."""
    response = client.responses.create(model="any", input="Weather in Paris, and 2 + 3?", tools=[WEATHER, ADD],
                                       max_output_tokens=64)
    calls = response.output
    assert [(c.type, c.name, json.loads(c.arguments)) for c in calls] == [
        ("function_call", "get_weather", {"city": "Paris"}), ("function_call", "add", {"a": 2, "b": 3})]
    assert len({c.call_id for c in calls}) == 2 and all(c.id.startswith("fc_") for c in calls)
    assert response.output_text == "" and [t.name for t in response.tools] == ["get_weather", "add"]
    sent = two_calls.messages(Generate)[-1]
    assert [tool.name for tool in sent.tools] == ["get_weather", "add"] and sent.parameters.grammar.type == "lark"
    client.responses.create(model="any", input="2 + 3?", tools=[WEATHER, ADD], max_output_tokens=64,
                            tool_choice={"type": "function", "name": "add"}, parallel_tool_calls=False)
    grammar = two_calls.messages(Generate)[-1].parameters.grammar.value
    assert "start: calls" in grammar and "get_weather" not in grammar


def test_streamed_text_events(client: openai.OpenAI, ends_itself: ScriptedScheduler, gateway: GatewayProcess) -> None:
    """The SDK's stream reads OpenAI's event sequence, numbered, and its final response equals
    the deltas; each SSE event names its type on an `event:` line."""
    with client.responses.stream(model="any", input="Hi", max_output_tokens=5) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text == " a b"
    assert events[0].response.status == "in_progress" and final.usage.output_tokens == 2
    assert final.output[0].id == events[2].item.id
    lines = requests.post(gateway.url + "/v1/responses", json={"input": "Hi", "stream": True}, timeout=5).text
    names = [line[len("event: "):] for line in lines.splitlines() if line.startswith("event: ")]
    types = [json.loads(line[len("data: "):])["type"] for line in lines.splitlines() if line.startswith("data: ")]
    assert names == types == TEXT_EVENTS


def test_streamed_incomplete_response(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """A stream cut by max_output_tokens ends with response.incomplete."""
    events = list(client.responses.create(model="any", input="Hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output[0].content[0].text == " a b"


def test_streamed_function_calls(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """Each call is an item whose arguments stream as deltas; the final response holds both calls."""
    with client.responses.stream(model="any", input="Weather?", tools=[WEATHER, ADD], max_output_tokens=64) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types.count("response.output_item.added") == 2 and types.count("response.function_call_arguments.done") == 2
    assert "response.output_text.delta" not in types and types[-1] == "response.completed"
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(a) for a in done] == [{"city": "Paris"}, {"a": 2, "b": 3}]
    assert [(c.name, c.arguments) for c in final.output] == [("get_weather", done[0]), ("add", done[1])]
    added = [e.item.call_id for e in events if e.type == "response.output_item.added"]
    assert [c.call_id for c in final.output] == added


def test_error_mid_stream_fails_the_response(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """An error after the first token ends the stream with an `error` event and `response.failed`."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker lost", "generation", after_texts=[" a"])
    events = list(client.responses.create(model="any", input="Hi", stream=True))
    error, failed = events[-2:]
    assert (error.type, error.message, error.code) == ("error", "worker lost", "generation")
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert (failed.response.error.code, failed.response.error.message) == ("server_error", "worker lost")
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_stored_responses_continue_with_previous_response_id(client: openai.OpenAI,
                                                           ends_itself: ScriptedScheduler) -> None:
    """`store: true` keeps the conversation, streamed or not; a follow-up sends it before its own
    input, with its own instructions only; a response not stored cannot be followed up."""
    first = client.responses.create(model="any", input="Hi", instructions="Old.", store=True)
    assert first.store is True
    with client.responses.stream(model="any", input="More", instructions="New.", store=True,
                                 previous_response_id=first.id) as stream:
        second = stream.get_final_response()
    assert second.previous_response_id == first.id
    client.responses.create(model="any", input="Last", previous_response_id=second.id)
    assert ends_itself.messages(Generate)[-1].messages == [
        ChatMessage("user", "Hi"), ChatMessage("assistant", " a b"), ChatMessage("user", "More"),
        ChatMessage("assistant", " a b"), ChatMessage("user", "Last")]
    not_stored = client.responses.create(model="any", input="Hi")
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.responses.create(model="any", input="Again", previous_response_id=not_stored.id)
    assert caught.value.body["param"] == "previous_response_id"


def test_stored_responses_are_retrieved_and_deleted(client: openai.OpenAI, ends_itself: ScriptedScheduler,
                                                    gateway: GatewayProcess) -> None:
    """responses.retrieve answers a stored response as it was created (streamed or not);
    responses.delete forgets it; a response not stored is a 404."""
    whole = client.responses.create(model="any", input="Hi", store=True, metadata={"k": "v"})
    with client.responses.stream(model="any", input="Hi", store=True) as stream:
        streamed = stream.get_final_response()
    assert client.responses.retrieve(whole.id) == whole
    retrieved = client.responses.retrieve(streamed.id)
    assert [item.id for item in retrieved.output] == [item.id for item in streamed.output]
    assert (retrieved.output_text, retrieved.usage, retrieved.status) == (" a b", streamed.usage, "completed")
    client.responses.delete(whole.id)
    for gone in (whole.id, client.responses.create(model="any", input="Hi").id):
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(gone)
    refused = requests.get(f"{gateway.url}/v1/responses/{streamed.id}?stream=true", timeout=5)
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "stream"


@pytest.mark.parametrize("extra,field", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input"),
    ({"input": [{"role": ["user"], "content": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "input"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": 0}, "background"),
    ({"store": "yes"}, "store"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ({"text": {"format": {"type": "regex"}}}, "text"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": "many"}, "max_output_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"instructions": 3}, "instructions"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"model": 7}, "model"),
])
def test_bad_input_is_422_naming_the_field(client: openai.OpenAI, scheduler: ScriptedScheduler, extra: dict,
                                           field: str) -> None:
    """Bad, unknown and unimplemented fields are refused before anything is queued, naming the field."""
    before = len(scheduler.messages(Generate))
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.responses.create(model="any", input="Hi", extra_body=extra)  # fields the SDK would not send too
    assert caught.value.body["param"] == field and f"`{field}" in caught.value.body["message"]
    assert len(scheduler.messages(Generate)) == before


def test_answers_match_the_document(gateway: GatewayProcess, two_calls: ScriptedScheduler) -> None:
    """Responses, their stream events and a 422 validate against our OpenAPI document."""
    document = openapi_document()
    body = {"input": "Weather?", "tools": [WEATHER, ADD], "max_output_tokens": 64}
    for extra in ({}, {"tools": None}):
        answer = requests.post(gateway.url + "/v1/responses", json={**body, **extra}, timeout=5)
        validate_response(document, "/v1/responses", "post", 200, answer.json())
        Response.model_validate(answer.json())
        stream = requests.post(gateway.url + "/v1/responses", json={**body, **extra, "stream": True}, timeout=5)
        for event in read_events(stream):
            validate_response(document, "/v1/responses", "post", 200, event, "text/event-stream")
            assert STREAM_EVENT.validate_python(event).type == event["type"]  # the SDK's own types, strictly
    bad = requests.post(gateway.url + "/v1/responses", json={"input": ""}, timeout=5)
    assert bad.status_code == 422
    validate_response(document, "/v1/responses", "post", 422, bad.json())
    stored = requests.post(gateway.url + "/v1/responses", json={**body, "store": True}, timeout=5).json()
    where = f"{gateway.url}/v1/responses/{stored['id']}"
    validate_response(document, "/v1/responses/{response_id}", "get", 200, requests.get(where, timeout=5).json())
    for method in ("delete", "get"):
        answer = requests.request(method, where, timeout=5)
        validate_response(document, "/v1/responses/{response_id}", method, answer.status_code, answer.json())


def test_refused_and_served_responses_are_counted(gateway: GatewayProcess, ends_itself: ScriptedScheduler) -> None:
    """A Responses request the gateway refuses counts as a validation failure, a served one as a success."""
    before = scrape(gateway)
    assert requests.post(gateway.url + "/v1/responses", json={"input": ""}, timeout=5).status_code == 422
    assert requests.post(gateway.url + "/v1/responses", json={"input": "Hi"}, timeout=5).status_code == 200
    after = scrape(gateway)
    assert moved(before, after, "tgi_request_failure_total", err="validation") == 1
    assert moved(before, after, "tgi_request_success_total") == 1
