"""The official `openai` client against a launched ztgi serving SmolLM2 (an API key set, as users would)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from unittest import mock

import openai
import pytest
import requests

from tests.e2e.server import LaunchedServer
from tests.vision_models import drawn_image

API_KEY = "e2e-key"
ORIGIN = "https://chat.example.com"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
NUM_TOKENS = 4  # the greedy chat answer, "The capital of France is Paris.", is longer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """One launched pipeline whose gateway needs an API key and allows one browser origin; float32,
    since the tests name greedy texts (bfloat16 parts from them at near-ties)."""
    with mock.patch.dict(os.environ, {"ZTGI_API_KEY": API_KEY, "ZTGI_CORS_ALLOW_ORIGIN": ORIGIN}):
        launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--dtype", "float32")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def client(server: LaunchedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def test_chat_stream_equals_greedy_completion(client: openai.OpenAI) -> None:
    """Greedy chat: the streamed deltas join into the non-streamed text; max_tokens bounds it; usage adds up."""
    completion = client.chat.completions.create(model="any", messages=QUESTION, temperature=0, max_tokens=NUM_TOKENS)
    text = completion.choices[0].message.content
    assert text == "The capital of France" and completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == NUM_TOKENS
    chunks = list(client.chat.completions.create(model="any", messages=QUESTION, temperature=0, max_tokens=NUM_TOKENS,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == NUM_TOKENS
    assert chunks[-1].usage.prompt_tokens == completion.usage.prompt_tokens


def test_completion_stream_equals_greedy_completion_and_stop_is_left_out(client: openai.OpenAI) -> None:
    """Greedy completions: streamed text equals the whole text; with stop ".", the text ends before it."""
    whole = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS)
    text = whole.choices[0].text
    assert whole.usage.completion_tokens == NUM_TOKENS and "." in text
    streamed = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text
    stopped = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS, stop=["."])
    assert stopped.choices[0].text == text[:text.index(".")]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS, stop=".",
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(".")]


def test_completion_logprobs_match_the_text_streamed_or_not(client: openai.OpenAI) -> None:
    """logprobs=2 on the real tokenizer: each token sits at its text_offset, 2 alternatives each, same when streamed."""
    whole = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS, logprobs=2)
    choice = whole.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == NUM_TOKENS
    assert "".join(logprobs.tokens) == choice.text
    for token, offset in zip(logprobs.tokens, logprobs.text_offset):
        assert choice.text[offset:offset + len(token)] == token
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert all(logprob <= 0 for logprob in logprobs.token_logprobs)
    streamed = list(client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS,
                                              logprobs=2, stream=True))
    assert [t for c in streamed for t in c.choices[0].logprobs.tokens] == logprobs.tokens
    assert [o for c in streamed for o in c.choices[0].logprobs.text_offset] == logprobs.text_offset


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    """The same seed gives the same sampled text: alone, and as choice 0 of an n=2 request."""
    def sample(seed: int, n: int = 1) -> list[str]:
        completion = client.chat.completions.create(model="any", messages=QUESTION, temperature=1.0, seed=seed,
                                                    max_tokens=NUM_TOKENS, n=n)
        return [choice.message.content for choice in completion.choices]

    first, second = sample(1234, n=2)
    assert sample(1234) == [first]


def test_presence_penalty_steers_greedy_text_off_words_already_present(client: openai.OpenAI) -> None:
    """Greedy, a repetitive prompt goes on with " mat"; presence_penalty 2 (-2 on every present token) does not."""
    def continuation(**arguments: float) -> list[str]:
        completion = client.completions.create(model="any", prompt="The cat sat on the mat. The cat sat on the",
                                               temperature=0, max_tokens=NUM_TOKENS, logprobs=0, **arguments)
        return completion.choices[0].logprobs.tokens

    plain = continuation()
    assert plain[0] == " mat"
    assert continuation(presence_penalty=0.0) == plain
    assert continuation(presence_penalty=2.0)[0] != " mat"


def test_logit_bias_removes_and_forces_a_token_on_both_routes(client: openai.OpenAI, server: LaunchedServer) -> None:
    """{id: -100} keeps the greedy first token out; {id: 100} makes one token every token chosen."""
    def token_id(text: str) -> int:
        [token] = server.post("/tokenize", {"inputs": text, "add_special_tokens": False},
                              headers={"Authorization": f"Bearer {API_KEY}"}).json()
        return int(token["id"])

    def first_tokens(logit_bias: dict[str, int] | None = None) -> tuple[str, str]:
        completion = client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=1,
                                               logprobs=0, logit_bias=logit_bias)
        chat = client.chat.completions.create(model="any", messages=QUESTION, temperature=0, max_tokens=1,
                                              logprobs=True, logit_bias=logit_bias)
        return completion.choices[0].logprobs.tokens[0], chat.choices[0].logprobs.content[0].token

    plain = first_tokens()
    for route, token in enumerate(plain):
        assert first_tokens({str(token_id(token)): -100})[route] != token
    forced = {str(token_id("=")): 100}
    assert client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=NUM_TOKENS,
                                     logit_bias=forced).choices[0].text == "=" * NUM_TOKENS
    assert client.chat.completions.create(model="any", messages=QUESTION, temperature=0, max_tokens=NUM_TOKENS,
                                          logit_bias=forced).choices[0].message.content == "=" * NUM_TOKENS


def test_models_retrieve_the_served_model_by_its_id(client: openai.OpenAI) -> None:
    """models.retrieve sends the id percent-encoded (it has a slash); another id is a 404."""
    [listed] = client.models.list().data
    assert "/" in listed.id
    model = client.models.retrieve(listed.id)
    assert isinstance(model, openai.types.Model) and model.id == listed.id
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no/such-model")
    assert "no/such-model" in caught.value.body["message"]


def test_x_request_id_is_echoed_names_the_answer_and_the_log(client: openai.OpenAI, server: LaunchedServer) -> None:
    """A client's x-request-id comes back on answers, streams and errors, is the completion's id
    (as vLLM), and names the request in the gateway's log; without one the server draws one."""
    raw = client.completions.with_raw_response.create(model="any", prompt=PROMPT, max_tokens=1,
                                                      extra_headers={"x-request-id": "eval-42"})
    assert raw.headers["x-request-id"] == "eval-42" and raw.parse().id == "cmpl-eval-42"
    with client.chat.completions.with_streaming_response.create(
            model="any", messages=QUESTION, max_tokens=1, stream=True,
            extra_headers={"x-request-id": "chat-7"}) as streamed:
        assert streamed.headers["x-request-id"] == "chat-7"
    assert client.models.with_raw_response.list().headers["x-request-id"]
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.completions.create(model="any", prompt=[49152], max_tokens=1,
                                  extra_headers={"x-request-id": "bad-ids-1"})
    assert caught.value.response.headers["x-request-id"] == "bad-ids-1"
    assert server.wait_for_log("[bad-ids-1] failed"), server.log
    refused = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1},
                          headers={"x-request-id": "x" * 200, "Authorization": f"Bearer {API_KEY}"})
    assert refused.status_code == 400 and "x-request-id" in refused.json()["error"]["message"]


def test_an_image_sent_to_this_text_model_is_refused(client: openai.OpenAI) -> None:
    """SmolLM2 takes no images: an image part is the client's error (422) naming the model, and /v1/models
    says so; the next request is served."""
    image = "data:image/png;base64," + base64.b64encode(drawn_image(16, 16, seed=0)).decode()
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="any", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is this?"}]}])
    assert "this model does not take images" in caught.value.body["message"]
    assert client.models.list().data[0].model_extra["input_modalities"] == ["text"]
    assert client.chat.completions.create(model="any", messages=QUESTION, max_tokens=1).choices[0].message.content


@pytest.mark.parametrize("arguments,field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ({"presence_penalty": -3.0}, "presence_penalty"),
    ({"max_tokens": 10_000}, "max_new_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"n": 9}, "n"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"49152": 1}}, "logit_bias"),  # outside SmolLM2's vocabulary
    ({"logit_bias": {"5": "high"}}, "logit_bias"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
])
def test_bad_arguments_raise_the_clients_error(client: openai.OpenAI, arguments: dict, field: str) -> None:
    """Out-of-range arguments raise openai's UnprocessableEntityError (422) carrying our message."""
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="any", messages=QUESTION, **arguments)
    assert field in caught.value.body["message"] and caught.value.body["code"] == "validation"


def test_api_key_and_cors_through_the_launcher(server: LaunchedServer) -> None:
    """ZTGI_API_KEY and ZTGI_CORS_ALLOW_ORIGIN reach the launched gateway: wrong key 401, listed origin allowed."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    assert requests.get(server.url + "/health", timeout=30).status_code == 200  # open without a key
    preflight = requests.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 204 and preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
