"""`--reasoning-parser think` on /v1/chat/completions, with the official `openai` client: the
answer's `<think>` block becomes `reasoning_content` (whole and streamed, tags split across
tokens), tool calls are read from the content only, and a template that opens the block is
found by asking a tokenizer. Token texts are scripted."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest
import requests

from tests.gateway.conftest import REPO_ROOT, GatewayProcess
from tests.gateway.openapi import validate_response
from tests.gateway.scripted_scheduler import ScriptedScheduler, token_steps
from ztgi.common.messages import Generate
from ztgi.common.tool_calls import call_text
from ztgi.services.gateway.api_docs import openapi_document

QUESTION = [{"role": "user", "content": "Hi"}]
THINKING = ["<th", "ink>", "\nHmm", ", a greeting.", "</", "think", ">\n", "\n", "Hello", "!"]
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}


def play(scheduler: ScriptedScheduler, texts: list[str]) -> None:
    scheduler.script = lambda generate: token_steps(generate.request_id, texts, finish_reason="eos_token")


def open_client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10)


@pytest.fixture(scope="module")
def thinking_gateway(shared_scheduler: ScriptedScheduler, shared_run_dir: str) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--reasoning-parser", "think")
    gateway.wait_healthy()
    yield gateway
    returncode, output = gateway.stop()
    assert returncode == 0 and "Traceback" not in output, output


@pytest.fixture
def client(thinking_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> Iterator[openai.OpenAI]:
    with open_client(thinking_gateway) as client:
        yield client


def test_answer_splits_into_reasoning_and_content(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """The `<think>` block is `reasoning_content`; the content is what follows, blank lines dropped."""
    play(scheduler, THINKING)
    message = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=16).choices[0].message
    assert (message.reasoning_content, message.content) == ("\nHmm, a greeting.", "Hello!")


def test_answers_match_the_document(thinking_gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A chat answer and its chunks with `reasoning_content` validate against our OpenAPI document."""
    play(scheduler, THINKING)
    body = {"messages": QUESTION, "max_tokens": 16}
    answer = requests.post(thinking_gateway.url + "/v1/chat/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["message"]["reasoning_content"] == "\nHmm, a greeting."
    validate_response(openapi_document(), "/v1/chat/completions", "post", 200, answer)
    stream = requests.post(thinking_gateway.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=10)
    chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    for chunk in chunks:
        validate_response(openapi_document(), "/v1/chat/completions", "post", 200, chunk, "text/event-stream")
    assert any("reasoning_content" in chunk["choices"][0]["delta"] for chunk in chunks)


def test_stream_sends_reasoning_deltas_then_content(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """Deltas carry `reasoning_content` until `</think>` (never a piece of a tag), then `content`."""
    play(scheduler, THINKING)
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, max_tokens=16, stream=True))
    deltas = [(getattr(c.choices[0].delta, "reasoning_content", None), c.choices[0].delta.content) for c in chunks]
    assert deltas == [(None, ""), (None, ""), ("\nHmm", ""), (", a greeting.", ""), (None, ""), (None, ""),
                      (None, ""), (None, ""), (None, "Hello"), (None, "!")]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_tool_calls_are_read_from_the_content(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """A call after the reasoning is a tool call, whole and streamed; the reasoning stays reasoning."""
    call = call_text("add", '{"a": 2}')
    play(scheduler, ["<think>", "Use add.", "</think>", "\n", call[:5], call[5:]])
    message = client.chat.completions.create(model="any", messages=QUESTION, tools=[ADD]).choices[0].message
    assert (message.reasoning_content, message.content) == ("Use add.", None)
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("add", '{"a": 2}')]
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, tools=[ADD], stream=True))
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == "Use add."
    calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "add" and "".join(c.function.arguments for c in calls) == '{"a": 2}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_template_that_opens_the_block(shared_run_dir: str, scheduler: ScriptedScheduler) -> None:
    """A generation prompt ending in `<think>`: the answer starts inside the reasoning (only
    `</think>` appears); a grammar then makes the answer close the block before its JSON."""
    scheduler.generation_prompt = "<|im_start|>assistant\n<think>\n"
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--reasoning-parser", "deepseek_r1")
    try:
        with open_client(gateway) as client:
            play(scheduler, ["Six", " times seven.", "</think>", "\n\n", "42"])
            message = client.chat.completions.create(model="any", messages=QUESTION).choices[0].message
            assert (message.reasoning_content, message.content) == ("Six times seven.", "42")
            chunks = list(client.chat.completions.create(model="any", messages=QUESTION, stream=True))
            assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == (
                "Six times seven.")
            play(scheduler, ["One.", "</think>", '{"a": ', "1}"])
            message = client.chat.completions.create(model="any", messages=QUESTION,
                                                     response_format={"type": "json_object"}).choices[0].message
            assert (message.reasoning_content, message.content) == ("One.", '{"a": 1}')
            assert scheduler.messages(Generate)[-1].parameters.grammar.value.startswith("start: REASONING answer\n")
    finally:
        returncode, output = gateway.stop()
    assert returncode == 0 and "the chat template opens the reasoning block" in output, output


def test_grammar_leaves_room_for_reasoning(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """A response_format's grammar goes down after an optional think block; the JSON is the content."""
    play(scheduler, ["<think>", "JSON it is.", "</think>", "\n", '{"a": 1}'])
    message = client.chat.completions.create(model="any", messages=QUESTION,
                                             response_format={"type": "json_object"}).choices[0].message
    assert (message.reasoning_content, message.content) == ("JSON it is.", '{"a": 1}')
    grammar = scheduler.messages(Generate)[-1].parameters.grammar
    assert grammar.type == "lark" and grammar.value.startswith("start: REASONING? answer\n")
    assert "answer: %json" in grammar.value


def test_without_a_parser_answers_are_unchanged(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """No `--reasoning-parser`: the tags are part of the content, and no reasoning_content is sent."""
    play(scheduler, THINKING)
    with open_client(gateway) as client:
        message = client.chat.completions.create(model="any", messages=QUESTION).choices[0].message
    assert message.content == "".join(THINKING) and "reasoning_content" not in message.model_dump(exclude_unset=True)


@pytest.mark.parametrize("service", ["gateway", "launcher"])
def test_unknown_parser_fails_at_start(service: str) -> None:
    """`--reasoning-parser` names a parser the gateway knows, or the gateway and `ztgi launch` stop at once."""
    result = subprocess.run([sys.executable, "-m", f"ztgi.services.{service}", "--reasoning-parser", "granite"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--reasoning-parser 'granite' is not a reasoning parser: use one of think, deepseek_r1, qwen3" in (
        result.stderr), result.stderr
