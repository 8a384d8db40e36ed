"""A launched ztgi serving SmolLM2 with `--reasoning-parser think` and an API key: a constrained
answer through the grammar that leaves room for reasoning, and the official `anthropic` client on
/v1/messages, answering what the chat route answers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import anthropic
import openai
import pytest

from tests.e2e.server import LaunchedServer
from ztgi.common.model_source import ModelSource
from ztgi.services.tokenizer.loading import load_tokenizer

API_KEY = "e2e-messages-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """float32: the tests name greedy texts, from which bfloat16 parts at near-ties."""
    with mock.patch.dict(os.environ, {"ZTGI_API_KEY": API_KEY}):
        launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--reasoning-parser", "think",
                                  "--dtype", "float32", startup_timeout_s=300)
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def chat(server: LaunchedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def messages(server: LaunchedServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def test_constrained_answer_under_the_reasoning_parser(chat: openai.OpenAI, server: LaunchedServer,
                                                       smollm2: ModelSource) -> None:
    """Under the grammar that leaves room for reasoning (compiled by the real tokenizer and
    worker), greedy SmolLM2 opens a think block and reasons until max_tokens: all reasoning, the
    same whole and streamed. With the tokens that could begin `<think>` biased away it answers the
    JSON, which is the content. A plain answer is all content (the template does not open the block)."""
    kwargs: dict[str, Any] = {"model": "any", "messages": QUESTION, "max_tokens": 24, "temperature": 0,
                              "response_format": CITY}
    choice = chat.chat.completions.create(**kwargs).choices[0]
    message = choice.message
    assert (choice.finish_reason, message.content) == ("length", "")
    assert message.reasoning_content.startswith("The capital of France")
    deltas = [c.choices[0].delta for c in chat.chat.completions.create(**kwargs, stream=True)]
    assert "".join(d.content or "" for d in deltas) == ""
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    tokenizer = load_tokenizer(smollm2.path)
    no_think = {str(i): -100 for i in range(len(tokenizer)) if (text := tokenizer.decode([i])) and
                "<think>".startswith(text)}
    answered = chat.chat.completions.create(**kwargs, logit_bias=no_think).choices[0].message
    assert answered.reasoning_content is None and isinstance(json.loads(answered.content)["city"], str)
    plain = chat.chat.completions.create(model="any", messages=QUESTION, max_tokens=6, temperature=0)
    assert plain.choices[0].message.content.startswith("The capital of France")
    assert plain.choices[0].message.reasoning_content is None
    assert "the chat template does not open the reasoning block" in server.log


def test_messages_answer_as_the_chat_route(messages: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    """A greedy message is the chat route's answer, whole and streamed; usage and count_tokens agree."""
    completion = chat.chat.completions.create(model="any", messages=QUESTION, max_tokens=6, temperature=0)
    message = messages.messages.create(model="smollm2", max_tokens=6, messages=QUESTION, extra_body=GREEDY)
    assert [(b.type, b.text) for b in message.content] == [("text", completion.choices[0].message.content)]
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 6)
    assert message.usage.input_tokens == completion.usage.prompt_tokens
    with messages.messages.stream(model="smollm2", max_tokens=6, messages=QUESTION, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == completion.choices[0].message.content
    count = messages.messages.count_tokens(model="smollm2", messages=QUESTION)
    assert count.input_tokens == completion.usage.prompt_tokens


def test_messages_tool_use(messages: anthropic.Anthropic) -> None:
    """`tool_choice: any` without parallel calls makes the model call the tool once: a tool_use
    block whose input fits the schema, the same when streamed as input_json_delta pieces."""
    kwargs = {"model": "smollm2", "max_tokens": 48, "messages": [{"role": "user", "content": "Weather in Paris?"}],
              "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
              "extra_body": GREEDY}
    message = messages.messages.create(**kwargs)
    calls = [b for b in message.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and isinstance(calls[0].input["city"], str)
    assert message.stop_reason == "tool_use"
    with messages.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(c.name, c.input) for c in calls]
