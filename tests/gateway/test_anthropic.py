"""Anthropic's `/v1/messages`, driven by the official `anthropic` client (its `x-api-key` header
against a gateway with an API key and `--reasoning-parser think`): the request as the chat the
pipeline gets, answers and stream events as the SDK parses them (text, thinking, tool_use, stop
sequences), and bad requests as Anthropic's 400. Token texts are scripted."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate_response
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps, token_steps
from tests.gateway.test_metrics import moved, scrape
from ztgi.common.messages import ChatMessage, Generate, TokenizeQuery, ToolCall
from ztgi.common.tool_calls import call_text
from ztgi.services.gateway.api_docs import openapi_document

API_KEY = "anthropic-test-key"
HI = [{"role": "user", "content": "Hi"}]
ADD = {"name": "add", "description": "Adds", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
CALL = call_text("add", '{"a": 2, "b": 3}')


def play(scheduler: ScriptedScheduler, texts: list[str], finish_reason: str = "eos_token") -> None:
    scheduler.script = lambda generate: token_steps(generate.request_id, texts, finish_reason=finish_reason,
                                                    input_tokens=7)


@pytest.fixture(scope="module")
def messages_gateway(shared_scheduler: ScriptedScheduler, shared_run_dir: str) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--reasoning-parser", "think",
                             env={"ZTGI_API_KEY": API_KEY})
    gateway.wait_healthy()
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0 and "Traceback" not in output, output


@pytest.fixture
def client(messages_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=messages_gateway.url, api_key=API_KEY, max_retries=0, timeout=10) as client:
        yield client


def post(gateway: GatewayProcess, body: dict, path: str = "/v1/messages", **headers: str) -> requests.Response:
    return requests.post(gateway.url + path, json=body, headers={"x-api-key": API_KEY, **headers}, timeout=10)


def test_message(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """A message: text block, stop reason, usage, the served model; sent down as the chat it means."""
    message = client.messages.create(model="claude-any", max_tokens=3, system="Be brief.", messages=HI,
                                     metadata={"user_id": "u1"}, cache_control={"type": "ephemeral"},
                                     extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 5})
    assert message.id.startswith("msg_") and (message.type, message.role) == ("message", "assistant")
    assert [(block.type, block.text) for block in message.content] == [("text", " a b c")]
    assert (message.model, message.stop_reason, message.stop_sequence) == ("test/tiny", "max_tokens", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (2, 3)
    sent = scheduler.messages(Generate)[-1]
    assert sent.messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    parameters = sent.parameters
    assert (parameters.max_new_tokens, parameters.temperature, parameters.top_p, parameters.top_k) == (3, 0.5, 0.9, 5)


def test_blocks_become_chat_turns(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """System text blocks, tool_use and tool_result blocks become the chat's system, calls and tool turns;
    earlier thinking blocks are left out."""
    client.messages.create(model="m", max_tokens=2, system=[{"type": "text", "text": "Sys"}], tools=[ADD], messages=[
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use add.", "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "add",
                                           "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "5"}]},
                                     {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}]}])
    sent = scheduler.messages(Generate)[-1]
    assert sent.messages == [
        ChatMessage("system", "Sys"), ChatMessage("user", "2+3?"),
        ChatMessage("assistant", "", [ToolCall("toolu_1", "add", '{"a": 2, "b": 3}')]),
        ChatMessage("tool", "5", tool_call_id="toolu_1"), ChatMessage("user", "Thanks")]
    assert [tool.name for tool in sent.tools] == ["add"] and "answer: calls | TEXT" in sent.parameters.grammar.value


def test_stream(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """The SDK's stream helper reads the events into the same message, text arriving in pieces."""
    with client.messages.stream(model="m", max_tokens=3, messages=HI) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert texts == [" a", " b", " c"]
    assert [(b.type, b.text) for b in message.content] == [("text", " a b c")]
    assert (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens) == ("max_tokens", 2, 3)


def test_raw_stream_events(messages_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """Every event is named and in Anthropic's order: message_start, a block's start, deltas and
    stop, message_delta with the stop reason and usage, message_stop."""
    play(scheduler, ["<think>", "Hmm", "</think>", "Yes"])
    response = post(messages_gateway, {"model": "m", "max_tokens": 8, "messages": HI, "stream": True})
    names = [line[len("event: "):] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    data = [json.loads(line[len("data: "):]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [event["type"] for event in data] == names
    assert data[2]["delta"] == {"type": "thinking_delta", "thinking": "Hmm"}
    assert data[5] == {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Yes"}}
    assert data[7]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert data[7]["usage"] == {"input_tokens": 7, "output_tokens": 4}


def test_thinking_block_first(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """With the reasoning parser, the reasoning is a thinking block before the text, whole and streamed."""
    play(scheduler, ["<thi", "nk>", "Greeting", ".</th", "ink>\n\n", "Hello"])
    message = client.messages.create(model="m", max_tokens=8, messages=HI)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", "Greeting."), ("text", "Hello")]
    with client.messages.stream(model="m", max_tokens=8, messages=HI) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in message.content]


def test_tool_use(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """An answer of calls is tool_use blocks (input an object) with stop_reason tool_use; streamed,
    the arguments come as input_json_delta and the SDK assembles the same input."""
    play(scheduler, ["<think>", "Add them.", "</think>", CALL[:9], CALL[9:20], CALL[20:]])
    message = client.messages.create(model="m", max_tokens=64, messages=HI, tools=[ADD],
                                     tool_choice={"type": "any"})
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    call = message.content[1]
    assert (call.name, call.input, call.id[:6], message.stop_reason) == ("add", {"a": 2, "b": 3}, "toolu_", "tool_use")
    assert "answer: calls\n" in scheduler.messages(Generate)[-1].parameters.grammar.value
    with client.messages.stream(model="m", max_tokens=64, messages=HI, tools=[ADD]) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [("thinking", None),
                                                                               ("tool_use", {"a": 2, "b": 3})]
    assert streamed.stop_reason == "tool_use"


def test_stop_sequence(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """An answer that ended on a stop sequence says which, and leaves it out of the text."""
    play(scheduler, ["Count", " 1 2", " EN", "D"], finish_reason="stop_sequence")
    message = client.messages.create(model="m", max_tokens=8, messages=HI, stop_sequences=["END", "STOP"])
    assert (message.content[0].text, message.stop_reason, message.stop_sequence) == (
        "Count 1 2 ", "stop_sequence", "END")
    assert scheduler.messages(Generate)[-1].parameters.stop == ["END", "STOP"]
    with client.messages.stream(model="m", max_tokens=8, messages=HI, stop_sequences=["END"]) as stream:
        streamed = stream.get_final_message()
    assert (streamed.content[0].text, streamed.stop_sequence) == ("Count 1 2 ", "END")


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "m", "messages": HI}, "missing field `max_tokens`"),
    ({"model": "m", "max_tokens": 0, "messages": HI}, "`max_tokens` must be strictly positive"),
    ({"max_tokens": 4, "messages": HI}, "`model` must be a non-empty string"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
     '`messages[0].role` must be "user" or "assistant"'),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "`messages[0].content[0].type` must be one of image, text, tool_result in a user turn"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "http://x"}}]}]}, "document blocks are not supported"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]},
     "host `x` is not in --allowed-media-domains"),
    ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}, "an image block's `source` must be"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "frobnicate": 1}, "`frobnicate`: unknown field"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "thinking": {"type": "enabled"}},
     "`thinking` is not supported by this server (with --reasoning-parser"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "metadata": "u1"}, "`metadata` must be an object"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "s"}]},
     "server tools are not supported"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "tool_choice": {"type": "any"}}, "`tool_choice` needs `tools`"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "top_k": 0}, "top_k"),
    ({"model": "m", "max_tokens": 4, "messages": HI, "stop_sequences": "END"}, "`stop_sequences` must be an array"),
])
def test_bad_requests_are_anthropic_400s(messages_gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                         body: dict, message: str) -> None:
    """Each is refused with 400 in Anthropic's error shape, naming the problem; nothing is generated."""
    response = post(messages_gateway, body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]
    assert scheduler.messages(Generate) == []


def test_sdk_raises_bad_request(client: anthropic.Anthropic) -> None:
    """The SDK reads the error as its own BadRequestError."""
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "tool", "content": "x"}])
    assert raised.value.body["error"]["type"] == "invalid_request_error"


def test_api_key_headers(messages_gateway: GatewayProcess) -> None:
    """`x-api-key` or a Bearer token opens the route; neither (or a wrong key) is Anthropic's 401."""
    body = {"model": "m", "max_tokens": 1, "messages": HI}
    assert post(messages_gateway, body).status_code == 200
    bearer = requests.post(messages_gateway.url + "/v1/messages", json=body, timeout=10,
                           headers={"Authorization": f"Bearer {API_KEY}"})
    assert bearer.status_code == 200
    refused = post(messages_gateway, body, **{"x-api-key": "wrong"})
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"


def test_error_mid_stream_is_an_error_event(messages_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A failure after the first token ends the stream with Anthropic's `error` event."""
    scheduler.script = lambda generate: error_steps(generate.request_id, "worker lost", "generation", [" a"])
    response = post(messages_gateway, {"model": "m", "max_tokens": 8, "messages": HI, "stream": True})
    lines = response.text.splitlines()
    assert lines[-3:-1] == ["event: error", 'data: {"type":"error","error":{"type":"api_error",'
                                            '"message":"worker lost"}}']


def test_count_tokens(client: anthropic.Anthropic, scheduler: ScriptedScheduler) -> None:
    """count_tokens asks a tokenizer for the template's prompt of system + messages."""
    count = client.messages.count_tokens(model="m", system="Sys", messages=HI)
    assert count.input_tokens == 1  # the scripted tokenizer answers one token
    query = scheduler.messages(TokenizeQuery)[-1]
    assert query.messages == [ChatMessage("system", "Sys"), ChatMessage("user", "Hi")]
    with pytest.raises(anthropic.BadRequestError, match="not taken by count_tokens"):
        client.messages.count_tokens(model="m", messages=HI, tools=[ADD])


def test_answers_match_the_document(messages_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """Messages, stream events, token counts and errors validate against our OpenAPI document."""
    document = openapi_document()
    play(scheduler, ["<think>", "Hmm", "</think>", CALL])
    body = {"model": "m", "max_tokens": 64, "messages": HI, "tools": [ADD]}
    validate_response(document, "/v1/messages", "post", 200, post(messages_gateway, body).json())
    streamed = post(messages_gateway, {**body, "stream": True}).text.splitlines()
    for line in streamed:
        if line.startswith("data: "):
            validate_response(document, "/v1/messages", "post", 200, json.loads(line[6:]), "text/event-stream")
    count = post(messages_gateway, {"model": "m", "messages": HI}, path="/v1/messages/count_tokens")
    validate_response(document, "/v1/messages/count_tokens", "post", 200, count.json())
    bad = post(messages_gateway, {"model": "m", "messages": HI})
    validate_response(document, "/v1/messages", "post", 400, bad.json())
    refused = post(messages_gateway, body, **{"x-api-key": "wrong"})
    validate_response(document, "/v1/messages", "post", 401, refused.json())


def test_messages_count_in_the_metrics(messages_gateway: GatewayProcess) -> None:
    """A message and a refused one count as generation requests, the refusal by its error type."""
    before = scrape(messages_gateway)
    assert post(messages_gateway, {"model": "m", "max_tokens": 2, "messages": HI}).status_code == 200
    assert post(messages_gateway, {"model": "m", "messages": HI}).status_code == 400
    after = scrape(messages_gateway)
    assert moved(before, after, "tgi_request_count_total") == 2
    assert moved(before, after, "tgi_request_success_total") == 1
    assert moved(before, after, "tgi_request_failure_total", err="validation") == 1
