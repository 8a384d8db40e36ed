"""Tool calls and structured output through the gateway, with the official `openai` client: what is
sent down (grammar, tools, conversation) and how answers of several calls come back, whole and as
`delta.tool_calls` chunks. Token texts are scripted (split inside names and arguments)."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate_response
from tests.gateway.scripted_scheduler import ScriptedScheduler, token_steps
from ztgi.common.messages import ChatMessage, Generate, Tool, ToolCall
from ztgi.common.tool_calls import call_text
from ztgi.services.gateway.api_docs import openapi_document

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
QUESTION = [{"role": "user", "content": "Weather in Paris, and 2 + 3?"}]
ANSWER = call_text("get_weather", '{"city": "Paris"}') + "\n" + call_text("add", '{"a": 2, "b": 3}')


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


@pytest.fixture
def two_calls(scheduler: ScriptedScheduler) -> ScriptedScheduler:
    scheduler.script = lambda generate: token_steps(generate.request_id, pieces(ANSWER), finish_reason="eos_token")
    return scheduler


def test_tools_travel_as_tools_and_a_grammar(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """tools + tool_choice become the tools to render and a Lark grammar of their calls; named
    choice allows only that function."""
    client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER, ADD], max_tokens=64)
    sent = two_calls.messages(Generate)[-1]
    assert [tool.name for tool in sent.tools] == ["get_weather", "add"]
    assert sent.tools[0] == Tool("get_weather", "Weather of a city", json.dumps(WEATHER["function"]["parameters"]))
    assert sent.parameters.grammar.type == "lark" and "start: calls | TEXT" in sent.parameters.grammar.value
    client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER, ADD], max_tokens=64,
                                   tool_choice={"type": "function", "function": {"name": "add"}})
    grammar = two_calls.messages(Generate)[-1].parameters.grammar.value
    assert "start: calls" in grammar and '\\"add\\"' in grammar and "get_weather" not in grammar
    client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER], tool_choice="none", max_tokens=4)
    sent = two_calls.messages(Generate)[-1]
    assert sent.tools is None and sent.parameters.grammar is None


def test_several_calls_in_one_answer(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """An answer of two calls is message.tool_calls with distinct ids and finish_reason tool_calls."""
    completion = client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER, ADD], max_tokens=64,
                                                tool_choice="required")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]
    assert len({c.id for c in calls}) == 2 and all(c.type == "function" for c in calls)


def test_several_calls_streamed_as_delta_tool_calls(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """Streamed, each call starts with its id, type and name, then its arguments come in pieces; the
    openai client's stream helper puts them back together."""
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER, ADD], max_tokens=64,
                                                 stream=True))
    starts = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if d.id is not None]
    assert [(d.index, d.function.name) for d in starts] == [(0, "get_weather"), (1, "add")]
    arguments = {0: "", 1: ""}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            arguments[delta.index] += delta.function.arguments or ""
        assert not chunk.choices[0].delta.content
    assert [json.loads(a) for a in arguments.values()] == [{"city": "Paris"}, {"a": 2, "b": 3}]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.beta.chat.completions.stream(model="any", messages=QUESTION, tools=[WEATHER, ADD],
                                             max_tokens=64) as stream:
        final = stream.get_final_completion()
    assert [c.function.name for c in final.choices[0].message.tool_calls] == ["get_weather", "add"]


def test_text_answers_stay_text(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """With tools offered, an answer that is not a call is content, streamed without holding back
    more than a possible call's start."""
    scheduler.script = lambda generate: token_steps(generate.request_id, ["<", "tools", " are", " fun"],
                                                    finish_reason="eos_token")
    completion = client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER], max_tokens=8)
    assert completion.choices[0].message.content == "<tools are fun" and not completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, tools=[WEATHER], max_tokens=8,
                                                 stream=True))
    assert [c.choices[0].delta.content for c in chunks] == ["", "<tools", " are", " fun"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_turns_are_carried_back(client: openai.OpenAI, two_calls: ScriptedScheduler) -> None:
    """An assistant turn's tool_calls (content null) and a tool turn's tool_call_id reach the tokenizer."""
    messages = [*QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], max_tokens=4)
    sent = two_calls.messages(Generate)[-1].messages
    assert sent[1] == ChatMessage("assistant", "", [ToolCall("call_1", "get_weather", '{"city": "Paris"}')])
    assert sent[2] == ChatMessage("tool", "18 C", None, "call_1")
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="any", messages=[*QUESTION, {"role": "tool", "content": "x"}],
                                       max_tokens=4)


def test_response_format_becomes_a_json_grammar(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """json_object is any object; json_schema is the schema, exact when strict and lenient otherwise."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    client.chat.completions.create(model="any", messages=QUESTION, max_tokens=4,
                                   response_format={"type": "json_object"})
    assert json.loads(scheduler.messages(Generate)[-1].parameters.grammar.value) == {"type": "object"}
    client.chat.completions.create(model="any", messages=QUESTION, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}})
    assert json.loads(scheduler.messages(Generate)[-1].parameters.grammar.value) == schema
    client.chat.completions.create(model="any", messages=QUESTION, max_tokens=4, response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert json.loads(scheduler.messages(Generate)[-1].parameters.grammar.value)["x-guidance"] == {"lenient": True}


def test_tool_call_answers_match_the_document(gateway: GatewayProcess, two_calls: ScriptedScheduler) -> None:
    """Whole and streamed answers of calls validate against our OpenAPI document."""
    document = openapi_document()
    body = {"messages": QUESTION, "tools": [WEATHER, ADD], "max_tokens": 64}
    whole = requests.post(gateway.url + "/v1/chat/completions", json=body, timeout=5)
    validate_response(document, "/v1/chat/completions", "post", 200, whole.json())
    streamed = requests.post(gateway.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                             timeout=5)
    events = [json.loads(line[5:]) for line in streamed.iter_lines()
              if line.startswith(b"data:") and line != b"data: [DONE]"]
    assert any("tool_calls" in event["choices"][0]["delta"] for event in events)
    for event in events:
        validate_response(document, "/v1/chat/completions", "post", 200, event, "text/event-stream")
