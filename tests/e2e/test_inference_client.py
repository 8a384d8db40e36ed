"""huggingface_hub's `InferenceClient` against a launched ztgi serving SmolLM2: TGI's API as the client expects it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from huggingface_hub import InferenceClient

from tests.e2e.server import LaunchedServer

PROMPT = "The capital of France is"
NUM_TOKENS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """One launched pipeline for the module (1 worker, 1 tokenizer, 1 gateway), in float32: the tests
    name greedy texts, and bfloat16 rows (one int8 level through the GGUF's blocks) part from them at
    near-ties and tie top tokens."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--dtype", "float32")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def client(server: LaunchedServer) -> InferenceClient:
    return InferenceClient(base_url=server.url, timeout=120)


@pytest.fixture(scope="module")
def greedy(client: InferenceClient):
    """The greedy answer with every detail TGI offers."""
    return client.text_generation(PROMPT, max_new_tokens=NUM_TOKENS, details=True, decoder_input_details=True,
                                  top_n_tokens=2)


def test_details_prefill_and_top_tokens(greedy) -> None:
    """details, decoder_input_details and top_n_tokens come back in TGI's shapes."""
    details = greedy.details
    assert details.finish_reason == "length" and details.generated_tokens == NUM_TOKENS
    assert greedy.generated_text == "".join(token.text for token in details.tokens)
    assert "Paris" in greedy.generated_text
    assert len(details.prefill) == 5 and details.prefill[0].logprob is None  # nothing predicts the first token
    assert all(token.logprob is not None and token.logprob <= 0 for token in details.prefill[1:])
    assert [len(top) for top in details.top_tokens] == [2] * NUM_TOKENS
    for token, top in zip(details.tokens, details.top_tokens):  # greedy: the chosen token is the likeliest
        # huggingface_hub leaves lists of lists of tokens as plain dicts
        assert top[0]["id"] == token.id and top[0]["logprob"] >= top[1]["logprob"]


def test_stream_equals_greedy_text(client: InferenceClient, greedy) -> None:
    """Streamed tokens join into the non-streamed greedy text; the last event carries it and the details."""
    events = list(client.text_generation(PROMPT, max_new_tokens=NUM_TOKENS, details=True, stream=True))
    assert "".join(event.token.text for event in events) == greedy.generated_text
    assert events[-1].generated_text == greedy.generated_text
    assert events[-1].details.finish_reason == "length"
    assert [event.token.id for event in events] == [token.id for token in greedy.details.tokens]


def test_stop_seed_and_full_text(client: InferenceClient, greedy) -> None:
    """stop ends the text right after the sequence (TGI's way); a seed makes sampling repeatable and is
    reported; return_full_text prepends the prompt."""
    stopped = client.text_generation(PROMPT, max_new_tokens=NUM_TOKENS, stop=["."], details=True)
    assert stopped.generated_text == greedy.generated_text[:greedy.generated_text.index(".") + 1]
    assert stopped.details.finish_reason == "stop_sequence"
    sampled = [client.text_generation(PROMPT, max_new_tokens=NUM_TOKENS, do_sample=True, seed=42, details=True,
                                      return_full_text=True) for _ in range(2)]
    assert sampled[0].generated_text == sampled[1].generated_text
    assert sampled[0].generated_text.startswith(PROMPT) and sampled[0].details.seed == 42


def test_chat_completion_stream(client: InferenceClient) -> None:
    """chat_completion streams deltas that join into the non-streamed greedy answer."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat_completion(messages, max_tokens=NUM_TOKENS, temperature=0).choices[0].message.content
    chunks = list(client.chat_completion(messages, max_tokens=NUM_TOKENS, temperature=0, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == answer
    assert answer == "The capital of France"
