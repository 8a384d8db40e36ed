"""SSE parsing and request bodies of the three APIs: TGI, OpenAI completions, OpenAI chat."""

from __future__ import annotations

import json

from ztgi.bench.config import BenchConfig
from ztgi.bench.http_backends import StreamChunk, make_backend
from ztgi.bench.workload import Prompt

PROMPT = Prompt("Hello there", max_new_tokens=12)


def _data(event: dict) -> bytes:
    return json.dumps(event).encode()


def test_tgi_token_final_and_error_events() -> None:
    """A token event counts, the event with generated_text ends (with its text and cached tokens),
    an error event fails."""
    tgi = make_backend(BenchConfig(backend="tgi"))
    token = {"id": 5, "text": " a", "logprob": -0.1, "special": False}
    assert tgi.parse(_data({"index": 1, "token": token, "generated_text": None, "details": None})) \
        == StreamChunk(has_token=True)
    final = tgi.parse(_data({"index": 2, "token": token, "generated_text": "a a",
                             "details": {"finish_reason": "length", "generated_tokens": 2, "cached_tokens": 16}}))
    assert final == StreamChunk(has_token=True, done=True, num_reported_tokens=2, text="a a", cached_tokens=16)
    error = tgi.parse(b'{"error":"Request failed during generation","error_type":"generation"}')
    assert error.error == "generation: Request failed during generation"


def test_tgi_payload_is_greedy_with_ignore_eos() -> None:
    """TGI body: inputs, max_new_tokens, greedy unless a temperature is set, ignore_eos on request."""
    greedy = make_backend(BenchConfig(backend="tgi", ignore_eos=True)).payload(PROMPT)
    assert greedy == {"inputs": "Hello there", "parameters": {"max_new_tokens": 12, "ignore_eos": True}}
    sampled = make_backend(BenchConfig(backend="tgi", temperature=0.7, seed=3)).payload(PROMPT)
    assert sampled["parameters"] == {"max_new_tokens": 12, "do_sample": True, "temperature": 0.7, "seed": 3}


def test_malformed_event_is_an_error_not_an_exception() -> None:
    """A payload that is not a JSON object becomes the request's error text."""
    for backend in ("tgi", "openai-completions", "openai-chat"):
        assert make_backend(BenchConfig(backend=backend)).parse(b"{not json").error.startswith("malformed event")
        assert make_backend(BenchConfig(backend=backend)).parse(b"[1, 2]").error.startswith("malformed event")


def test_openai_completions_chunks_usage_and_done() -> None:
    """Text chunks count, empty ones don't, usage reports the count, [DONE] ends."""
    completions = make_backend(BenchConfig(backend="openai-completions"))
    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": " a", "finish_reason": None}]}
    assert completions.parse(_data(chunk)) == StreamChunk(has_token=True)
    chunk["choices"][0]["text"] = ""
    assert completions.parse(_data(chunk)) == StreamChunk()
    usage = {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}
    assert completions.parse(_data(usage)) == StreamChunk(num_reported_tokens=9)
    assert completions.parse(b"[DONE]") == StreamChunk(done=True)


def test_openai_errors_in_both_shapes() -> None:
    """OpenAI's nested error object and TGI's flat error both give `type: message`."""
    completions = make_backend(BenchConfig(backend="openai-completions"))
    nested = completions.parse(_data({"error": {"message": "too long", "type": "invalid_request_error"}}))
    assert nested.error == "invalid_request_error: too long"
    flat = completions.parse(_data({"error": "overloaded", "error_type": "overloaded"}))
    assert flat.error == "overloaded: overloaded"
    vllm = completions.parse(_data({"object": "error", "message": "bad", "type": "BadRequestError"}))
    assert vllm.error == "BadRequestError: bad"


def test_openai_chat_role_chunk_is_not_a_token() -> None:
    """The opening role-only delta carries no token; a content delta does."""
    chat = make_backend(BenchConfig(backend="openai-chat"))
    role = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert chat.parse(_data(role)) == StreamChunk()
    content = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    assert chat.parse(_data(content)) == StreamChunk(has_token=True)
    assert chat.parse(b"[DONE]").done


def test_openai_payloads_stream_with_usage() -> None:
    """Completions send the prompt, chat one user message; both stream greedy with usage."""
    config = BenchConfig(backend="openai-chat", model="smol", ignore_eos=True)
    chat = make_backend(config).payload(PROMPT)
    assert chat["messages"] == [{"role": "user", "content": "Hello there"}]
    assert {k: chat[k] for k in ("model", "max_tokens", "stream", "temperature", "ignore_eos")} == \
        {"model": "smol", "max_tokens": 12, "stream": True, "temperature": 0.0, "ignore_eos": True}
    assert chat["stream_options"] == {"include_usage": True}
    completions = make_backend(BenchConfig(backend="openai-completions")).payload(PROMPT)
    assert completions["prompt"] == "Hello there" and "ignore_eos" not in completions
