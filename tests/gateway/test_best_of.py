"""best_of (TGI), OpenAI `n` choices and /invocations, over the scripted scheduler."""

from __future__ import annotations

import dataclasses

import openai
import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, Steps, default_script, token_steps
from tests.gateway.sse_reader import read_events
from ztgi.common.messages import Generate, Token

SAMPLED = {"max_new_tokens": 2, "do_sample": True, "details": True}


def likelier_with_even_seeds(generate: Generate) -> Steps:
    """Even seeds give " good good" (logprob -0.1 each), odd ones " bad bad" (-3.0 each)."""
    even = generate.parameters.seed % 2 == 0
    text, logprob = (" good", -0.1) if even else (" bad", -3.0)
    steps = token_steps(generate.request_id, [text, text], seed=generate.parameters.seed)
    return [[dataclasses.replace(e, token=Token(e.token.id, e.token.text, logprob, False)) for e in step]
            for step in steps]


def test_best_of_returns_the_likeliest_sequence(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                                schemas: dict) -> None:
    """best_of=2 sends two requests with consecutive seeds; the higher total logprob wins, the other
    is in details.best_of_sequences."""
    scheduler.script = likelier_with_even_seeds
    response = requests.post(gateway.url + "/generate", json={"inputs": "Hi", "parameters": {**SAMPLED, "best_of": 2}},
                             timeout=10)
    assert response.status_code == 200, response.text
    body = response.json()
    validate(body, "GenerateResponse", schemas)
    seeds = sorted(g.parameters.seed for g in scheduler.messages(Generate))
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1
    assert body["generated_text"] == " good good" and body["details"]["seed"] % 2 == 0
    [other] = body["details"]["best_of_sequences"]
    assert other["generated_text"] == " bad bad" and other["seed"] % 2 == 1
    assert [t["logprob"] for t in other["tokens"]] == [-3.0, -3.0]


def test_best_of_one_is_a_plain_request(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """best_of=1 (even greedy) is one request and no best_of_sequences."""
    response = requests.post(gateway.url + "/generate",
                             json={"inputs": "Hi", "parameters": {"best_of": 1, "details": True}}, timeout=10)
    assert response.status_code == 200 and response.json()["details"]["best_of_sequences"] is None
    assert len(scheduler.messages(Generate)) == 1


@pytest.mark.parametrize("parameters,route,words", [
    ({"best_of": 2, "max_new_tokens": 2}, "/generate", ["best_of", "sampling"]),
    ({"best_of": 2, "do_sample": True, "seed": 3}, "/generate", ["seed", "best_of"]),
    ({"best_of": 2, "temperature": 0.5}, "/generate_stream", ["best_of", "streaming"]),
    ({"best_of": 3, "do_sample": True}, "/", ["best_of", "<= 2"]),
    ({"best_of": 0}, "/generate", ["best_of"]),
    ({"best_of": -1, "do_sample": True}, "/invocations", ["best_of"]),
])
def test_bad_best_of_is_422(gateway: GatewayProcess, scheduler: ScriptedScheduler, parameters: dict, route: str,
                            words: list[str]) -> None:
    """TGI's best_of rules: sampling needed, no seed, no stream, at most max_best_of; 422 naming the field."""
    response = requests.post(gateway.url + route, json={"inputs": "Hi", "parameters": parameters}, timeout=5)
    assert response.status_code == 422, response.text
    assert all(word in response.json()["error"] for word in words), response.json()
    assert not scheduler.messages(Generate)


def test_invocations_is_compat_generate(gateway: GatewayProcess, scheduler: ScriptedScheduler, schemas: dict) -> None:
    """POST /invocations answers as POST /: a list of one GenerateResponse, or a TGI stream."""
    body = requests.post(gateway.url + "/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
                         timeout=5).json()
    assert body == [{"generated_text": " a b"}]
    stream = requests.post(gateway.url + "/invocations", json={"inputs": "Hi", "stream": True}, stream=True, timeout=5)
    events = read_events(stream)
    for event in events:
        validate(event, "StreamResponse", schemas)
    assert events[-1]["generated_text"] == " a b c"


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10) as client:
        yield client


def per_seed_text(generate: Generate) -> Steps:
    """` s<seed>` as the only token, so each choice shows which seed it ran with."""
    if generate.parameters.seed is None:
        return default_script(generate)
    return token_steps(generate.request_id, [f" s{generate.parameters.seed}"], seed=generate.parameters.seed)


def test_chat_n_choices(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """n=3 gives three choices indexed 0..2; a seeded request's choice j runs with seed + j; the
    prompt counts once in usage."""
    scheduler.script = per_seed_text
    completion = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                                n=3, seed=10)
    assert [(c.index, c.message.content) for c in completion.choices] == [(0, " s10"), (1, " s11"), (2, " s12")]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 3)


def test_chat_n_choices_stream(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """Streaming n=2 interleaves chunks of both choices, each tagged with its index; usage sums them."""
    chunks = list(client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], n=2,
                                                 max_tokens=2, stream=True, stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].delta.content
    assert texts == {0: " a b", 1: " a b"}
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 4)


def test_completions_n_choices_are_prompt_major(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """Two prompts with n=2: choices 0-1 belong to the first prompt, 2-3 to the second (OpenAI's order)."""
    scheduler.script = per_seed_text
    completion = client.completions.create(model="any", prompt=["One", "Two"], n=2, seed=7)
    assert [c.text for c in completion.choices] == [" s7", " s8", " s7", " s8"]
    prompts = [g.inputs for g in scheduler.messages(Generate)]
    assert sorted(prompts) == ["One", "One", "Two", "Two"]


def test_too_many_choices_is_422(client: openai.OpenAI, scheduler: ScriptedScheduler) -> None:
    """Choices beyond --max-client-batch-size (4) are refused, naming `n`."""
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.completions.create(model="any", prompt=["One", "Two"], n=3)
    assert caught.value.body["param"] == "n" and "<= 2" in caught.value.body["message"]
    assert not scheduler.messages(Generate)


def test_completions_best_of_returns_the_n_likeliest_of_best_of_candidates(client: openai.OpenAI,
                                                                           scheduler: ScriptedScheduler) -> None:
    """best_of=3, n=2, seed 10: three candidates (seeds 10, 11, 12) are generated, and the two
    likeliest (the even seeds' " good good") are returned (before: best_of was ignored, two
    candidates ran and the " bad bad" one came back)."""
    scheduler.script = likelier_with_even_seeds
    completion = client.completions.create(model="any", prompt="Hi", n=2, best_of=3, seed=10, max_tokens=2)
    assert sorted(g.parameters.seed for g in scheduler.messages(Generate)) == [10, 11, 12]
    assert [(c.index, c.text) for c in completion.choices] == [(0, " good good"), (1, " good good")]


@pytest.mark.parametrize("extra, problem", [
    ({"n": 2, "best_of": 1}, ">= `n`"),
    ({"best_of": 5}, "<= 4"),
    ({"best_of": 2, "stream": True}, "streaming"),
    ({"best_of": 2, "temperature": 0}, "sampling"),
])
def test_completions_best_of_that_cannot_be_served_is_422(client: openai.OpenAI, scheduler: ScriptedScheduler,
                                                          extra: dict, problem: str) -> None:
    """best_of below n, beyond --max-client-batch-size, with streaming or greedy: a 422 naming
    `best_of`, nothing queued (never silently ignored)."""
    response = requests.post(str(client.base_url) + "completions",
                             json={"model": "any", "prompt": "Hi", **extra}, timeout=10)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "best_of" and problem in error["message"], error
    assert not scheduler.messages(Generate)
