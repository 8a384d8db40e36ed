"""The OpenAI routes, driven by the official `openai` client and checked against TGI's schemas."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, Steps, error_steps, token_steps
from ztgi.common.messages import ChatMessage, Generate
from ztgi.common.parameters import resolve_sampling

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


def test_chat_completion(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """A chat completion carries the text, finish reason, usage and the served model's id."""
    completion = client.chat.completions.create(model="any", messages=CHAT, max_tokens=3, temperature=0)
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", " a b c", "length")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens,
            completion.usage.total_tokens) == (2, 3, 5)
    assert completion.model == "test/tiny" and completion.object == "chat.completion"
    sent = scheduler.messages(Generate)[-1]
    assert sent.inputs is None
    assert sent.messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi there")]
    assert (sent.parameters.max_new_tokens, sent.parameters.do_sample) == (3, False)


def test_chat_completion_samples_unless_temperature_is_0(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """As in TGI: no temperature means sampling; top_p 1.0 means no nucleus filter."""
    client.chat.completions.create(model="any", messages=CHAT, max_tokens=1, top_p=1.0, seed=4)
    sent = scheduler.messages(Generate)[-1].parameters
    assert (sent.do_sample, sent.top_p, sent.seed) == (True, None, 4)


def test_temperature_0_stays_greedy_with_top_p(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """temperature 0 with a top_p is greedy (as vLLM); the top_p, which would turn sampling on, is dropped."""
    client.chat.completions.create(model="any", messages=CHAT, max_tokens=1, temperature=0, top_p=0.5)
    sent = scheduler.messages(Generate)[-1].parameters
    assert (sent.do_sample, sent.top_p) == (False, None)
    assert not resolve_sampling(sent).do_sample
    client.completions.create(model="any", prompt="One", max_tokens=1, temperature=0.7, top_p=0.5)
    assert scheduler.messages(Generate)[-1].parameters.top_p == 0.5  # sampling keeps it
    with pytest.raises(openai.UnprocessableEntityError):  # still checked
        client.completions.create(model="any", prompt="One", max_tokens=1, temperature=0, top_p=1.5)


def test_chat_completion_logprobs(client: openai.OpenAI) -> None:
    """logprobs + top_logprobs give per-token logprobs with the top alternatives."""
    completion = client.chat.completions.create(model="any", messages=CHAT, max_tokens=2, logprobs=True,
                                                top_logprobs=2)
    content = completion.choices[0].logprobs.content
    assert [c.token for c in content] == [" a", " b"] and content[0].logprob == -0.5
    assert [len(c.top_logprobs) for c in content] == [2, 2]


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    """Streaming chat: one delta per token, finish_reason on the last, then a usage chunk."""
    chunks = list(client.chat.completions.create(model="any", messages=CHAT, max_tokens=3, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert deltas == [" a", " b", " c"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, None, "length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_chat_answers_match_tgi_schemas(gateway: GatewayProcess, schemas: dict) -> None:
    """Raw chat JSON and chunks validate against TGI's ChatCompletion and ChatCompletionChunk."""
    body = {"messages": CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": 1}
    validate(requests.post(gateway.url + "/v1/chat/completions", json=body, timeout=5).json(),
             "ChatCompletion", schemas)
    response = requests.post(gateway.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                             timeout=5)
    lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    for event in read_events_before_done(lines):
        validate(event, "ChatCompletionChunk", schemas)


def read_events_before_done(lines: list[bytes]) -> list[dict]:
    return [json.loads(line[len(b"data:"):]) for line in lines if line != b"data: [DONE]"]


def test_completions_one_choice_per_prompt(client: openai.OpenAI, gateway: GatewayProcess, schemas: dict) -> None:
    """/v1/completions answers each prompt of a batch as its own choice; echo prepends it."""
    completion = client.completions.create(model="any", prompt=["One", "Two"], max_tokens=2, echo=True)
    assert [(c.index, c.text) for c in completion.choices] == [(0, "One a b"), (1, "Two a b")]
    assert completion.usage.completion_tokens == 4
    raw = requests.post(gateway.url + "/v1/completions", json={"prompt": "One", "max_tokens": 1}, timeout=5).json()
    validate(raw, "CompletionFinal", schemas)


def test_completions_default_to_100_new_tokens(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """Without max_tokens a completion asks for TGI's default of 100 new tokens."""
    scheduler.script = lambda g: error_steps(g.request_id, "enough", "generation", after_texts=[" a"])
    with pytest.raises(openai.APIError):
        client.completions.create(model="any", prompt="One")
    assert scheduler.messages(Generate)[-1].parameters.max_new_tokens == 100


def test_completions_stream_merges_prompts(client: openai.OpenAI, gateway: GatewayProcess, schemas: dict) -> None:
    """Streaming several prompts interleaves their chunks, each tagged with its choice index."""
    chunks = list(client.completions.create(model="any", prompt=["One", "Two"], max_tokens=2, stream=True))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == {0: " a b", 1: " a b"}
    response = requests.post(gateway.url + "/v1/completions", json={"prompt": "One", "max_tokens": 2,
                                                                      "stream": True}, stream=True, timeout=5)
    for event in read_events_before_done([line for line in response.iter_lines() if line]):
        validate(event, "Chunk", schemas)


def assert_offsets_match_text(text: str, logprobs: object) -> None:
    """Each token's text starts at its text_offset in the choice's text."""
    for token, offset in zip(logprobs.tokens, logprobs.text_offset):
        assert text[offset:offset + len(token)] == token, (text, logprobs)


def test_completion_logprobs_have_openais_legacy_shape(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """logprobs=2: tokens, their logprobs, the 2 likeliest alternatives per position and each token's offset."""
    completion = client.completions.create(model="any", prompt="One", max_tokens=3, logprobs=2)
    choice = completion.choices[0]
    assert scheduler.messages(Generate)[-1].parameters.top_n_tokens == 2
    assert choice.text == " a b c"
    assert choice.logprobs.tokens == [" a", " b", " c"]
    assert choice.logprobs.token_logprobs == [-0.5, -1.5, -2.5]
    assert choice.logprobs.top_logprobs == [{"t0": -1.0, "t1": -2.0}] * 3
    assert choice.logprobs.text_offset == [0, 2, 4]
    assert_offsets_match_text(choice.text, choice.logprobs)


def test_completion_logprobs_0_has_no_alternatives_and_echo_adds_the_prompts_tokens(
        client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """logprobs=0 asks for no top tokens (top_logprobs null); with echo the prompt's tokens come
    first (asked for as `decoder_input_details`), the first without a logprob, as vLLM answers."""
    completion = client.completions.create(model="any", prompt="Hi", max_tokens=2, logprobs=0, echo=True)
    choice = completion.choices[0]
    sent = scheduler.messages(Generate)[-1].parameters
    assert sent.top_n_tokens is None and sent.decoder_input_details
    assert choice.text == "Hi a b" and choice.logprobs.top_logprobs is None
    assert choice.logprobs.tokens == ["<s>", "Hi", " a", " b"]  # the scripted prompt's tokens: <s> is special
    assert choice.logprobs.token_logprobs[:2] == [None, -2.5]
    assert choice.logprobs.text_offset == [0, 0, 2, 4]
    assert client.completions.create(model="any", prompt="One", max_tokens=1).choices[0].logprobs is None


def test_streamed_echo_shifts_offsets(client: openai.OpenAI) -> None:
    """Streamed with echo, the prompt is the first chunk and the tokens' offsets start after it."""
    chunks = list(client.completions.create(model="any", prompt="One", max_tokens=2, logprobs=0, echo=True,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "One a b"
    assert [c.choices[0].logprobs.text_offset for c in chunks if c.choices[0].logprobs] == [[3], [5]]


def test_streamed_completion_chunks_carry_their_tokens_logprobs(client: openai.OpenAI) -> None:
    """Streamed, each chunk carries its own token's entries, offsets running on across chunks, per choice."""
    chunks = list(client.completions.create(model="any", prompt=["One", "Two"], max_tokens=3, logprobs=1,
                                            stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert [c.logprobs.tokens for c in mine] == [[" a"], [" b"], [" c"]]
        assert [c.logprobs.text_offset for c in mine] == [[0], [2], [4]]
        assert [c.logprobs.top_logprobs for c in mine] == [[{"t0": -1.0}]] * 3
        assert [c.logprobs.token_logprobs for c in mine] == [[-0.5], [-1.5], [-2.5]]


@pytest.mark.parametrize("extra,field,message", [
    ({"max_tokens": 0}, "max_tokens", "`max_tokens` must be strictly positive (0 is accepted with `echo`: the "
                                      "prompt scored, nothing generated). Given: 0"),
    ({"logprobs": 6}, "logprobs", "`logprobs` must be >= 0 and <= 5 (--max-top-n-tokens). Given: 6"),
    ({"logprobs": -1}, "logprobs", "`logprobs` must be >= 0 and <= 5 (--max-top-n-tokens). Given: -1"),
    ({"presence_penalty": 3}, "presence_penalty", "`presence_penalty` must be >= -2.0 and <= 2.0"),
])
def test_completion_bad_input_is_422(client: openai.OpenAI, scheduler: ScriptedScheduler, extra: dict, field: str,
                                     message: str) -> None:
    """Out-of-range /v1/completions parameters are a 422 naming the field the request sent (max_tokens, not
    TGI's max_new_tokens), with the limit (logprobs above --max-top-n-tokens, presence_penalty outside -2..2)."""
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.completions.create(model="any", prompt="One", **extra)
    assert caught.value.body["param"] == field
    assert caught.value.body["message"] == message
    assert not scheduler.messages(Generate)


def test_completion_stream_with_usage(client: openai.OpenAI) -> None:
    """stream_options.include_usage on /v1/completions: a last chunk with no choice and the usage of all choices."""
    chunks = list(client.completions.create(model="any", prompt=["One", "Two"], max_tokens=2, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 8)  # a prompt counts once
    assert all(c.choices and c.usage is None for c in chunks[:-1])
    plain = list(client.completions.create(model="any", prompt="One", max_tokens=2, stream=True))
    assert all(c.choices for c in plain)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    """/v1/models lists the model the scheduler reports."""
    assert [m.id for m in client.models.list().data] == ["test/tiny"]


@pytest.mark.parametrize("extra,field", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name", "parameters": {}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}},
     "response_format"),
    ({"n": 5}, "n"),
    ({"temperature": -1.0}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"logprobs": True, "top_logprobs": 6}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": -1, "max_tokens": 5}, "max_completion_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
])
def test_chat_bad_input_is_422(client: openai.OpenAI, scheduler: ScriptedScheduler, extra: dict, field: str) -> None:
    """Unsupported or out-of-range chat parameters are refused with 422 naming the field."""
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="any", messages=CHAT, **extra)
    assert field in str(caught.value.body)  # the client unwraps {"error": ...} into body
    assert caught.value.body["param"] == field
    assert not scheduler.messages(Generate)


def test_presence_penalty_reaches_the_scheduler(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """presence_penalty of chat and completions travels to the scheduler as given; unset stays unset."""
    client.chat.completions.create(model="any", messages=CHAT, max_tokens=1, presence_penalty=1.25)
    assert scheduler.messages(Generate)[-1].parameters.presence_penalty == 1.25
    client.completions.create(model="any", prompt="One", max_tokens=1, presence_penalty=-0.5)
    assert scheduler.messages(Generate)[-1].parameters.presence_penalty == -0.5
    client.completions.create(model="any", prompt="One", max_tokens=1)
    assert scheduler.messages(Generate)[-1].parameters.presence_penalty is None


def test_chat_messages_must_be_well_formed(gateway: GatewayProcess) -> None:
    """Malformed messages and image parts without a URL are 422 naming `messages`."""
    for messages in ([], [{"content": "x"}], [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]):
        response = requests.post(gateway.url + "/v1/chat/completions", json={"messages": messages}, timeout=5)
        error = response.json()["error"]  # OpenAI's error object under /v1
        assert response.status_code == 422 and error["param"] == "messages" and "messages" in error["message"]


def test_overloaded_is_a_rate_limit_error(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """A 429 from an overloaded scheduler reaches the openai client as RateLimitError."""
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="any", messages=CHAT)


def test_error_mid_stream_raises_in_the_openai_client(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """An error after some chunks ends the stream with an error the openai client raises."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker lost", "generation", after_texts=[" a"])
    stream = client.chat.completions.create(model="any", messages=CHAT, stream=True)
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert caught.value.body == "worker lost"  # TGI's {"error": "...", "error_type": ...} event


def stopped_on_blank_line(generate: Generate) -> Steps:
    """The pipeline's text for stop ["\\n\\n"]: it ends right after the sequence, split over two tokens."""
    return token_steps(generate.request_id, [" Paris", ".\n", "\n"], finish_reason="stop_sequence")


def test_stop_sequence_is_left_out_of_openai_text(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """As OpenAI: the stop sequence is not in the text, streamed (even split over tokens) or not."""
    scheduler.script = stopped_on_blank_line
    chat = client.chat.completions.create(model="any", messages=CHAT, stop=["\n\n"])
    assert (chat.choices[0].message.content, chat.choices[0].finish_reason) == (" Paris.", "stop")
    chunks = client.chat.completions.create(model="any", messages=CHAT, stop="\n\n", stream=True)
    assert "".join(c.choices[0].delta.content for c in chunks) == " Paris."
    completion = client.completions.create(model="any", prompt="The capital", stop=["\n\n"])
    assert completion.choices[0].text == " Paris."
    chunks = client.completions.create(model="any", prompt="The capital", stop=["\n\n"], stream=True)
    assert "".join(c.choices[0].text for c in chunks) == " Paris."


def test_stop_sequence_tokens_keep_their_logprobs(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """As vLLM: every generated token has a logprobs entry (as usage counts them), a cut stop sequence's too."""
    scheduler.script = stopped_on_blank_line
    completion = client.completions.create(model="any", prompt="The capital", stop=["\n\n"], logprobs=0)
    choice = completion.choices[0]
    assert choice.text == " Paris." and completion.usage.completion_tokens == 3
    assert (choice.logprobs.tokens, choice.logprobs.text_offset) == ([" Paris", ".\n", "\n"], [0, 6, 8])
