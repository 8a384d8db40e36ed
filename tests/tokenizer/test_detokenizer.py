"""Detokenizer: TGI's incremental detokenization, stop sequences and final details."""

from __future__ import annotations

import math

import pytest

from ztgi.common.codec import decode
from ztgi.common.messages import (
    DetokenizeJob,
    Generate,
    GenerateParameters,
    Generation,
    RequestKey,
    StreamEvent,
    StreamEvents,
    TextBatch,
    TokenStep,
)
from ztgi.common.parameters import ParameterLimits
from ztgi.services.tokenizer.detokenizer import Detokenizer
from ztgi.services.tokenizer.encoder import Encoder

PROMPT = "Write something:"
EOS_ID = 2  # <|im_end|>

MULTILINGUAL_OUTPUTS = [
    "😀 日本語 héllo 🤖👍🏽",
    "你好，世界！今天天气很好。",
    "Emoji family: 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 end",
    "mixed ASCII, ñandú, Ελληνικά, русский, العربية, हिन्दी ✓",
    "🎉🎉🎉",
]


@pytest.fixture
def detokenizer(tokenizer) -> Detokenizer:
    return Detokenizer(tokenizer)


def _start(detokenizer: Detokenizer, key: RequestKey, **params) -> None:
    encoder = Encoder(detokenizer.tokenizer, ParameterLimits(), b"tokenizer-test")
    generate = Generate(key.request_id, PROMPT, None, GenerateParameters(**params))
    detokenizer.start(encoder.encode(key, generate), generate.parameters)


def _events(batch: TextBatch, client_id: bytes) -> list[StreamEvent]:
    payloads = [output.payload for output in batch.outputs if output.client_id == client_id]
    return [event for payload in payloads for event in decode(payload, StreamEvents).events]


def _stream(detokenizer: Detokenizer, key: RequestKey, ids: list[int], finish_reason: str | None = "length",
            **generation) -> tuple[list[StreamEvent], list[RequestKey]]:
    """Feeds `ids` one step each (the last with `finish_reason`); all events and stop hits."""
    events, finished = [], []
    for index, token_id in enumerate(ids):
        last = index == len(ids) - 1
        step = Generation(0, token_id, -0.25, finish_reason if last else None, index + 1,
                          **(generation if index == 0 else {}))
        batch = detokenizer.detokenize(DetokenizeJob([TokenStep(key, step)]))
        events += _events(batch, key.client_id)
        finished += batch.finished
    return events, finished


@pytest.mark.parametrize("text", MULTILINGUAL_OUTPUTS)
def test_streamed_texts_concatenate_to_the_decoded_output(detokenizer, tokenizer, text):
    """Token texts never hold half a character and add up to decode(ids) and generated_text."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode(text)
    _start(detokenizer, key)
    events, _ = _stream(detokenizer, key, ids)
    texts = [event.token.text for event in events]
    assert not any("\ufffd" in piece for piece in texts)
    assert "".join(texts) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert events[-1].generated_text == text
    assert [event.token.id for event in events] == ids


def test_emoji_split_over_tokens_appears_whole_in_one_token(detokenizer, tokenizer):
    """An emoji spread over several byte tokens streams as "" then the whole emoji (TGI)."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("😀")
    assert len(ids) > 1
    _start(detokenizer, key)
    events, _ = _stream(detokenizer, key, ids)
    assert [event.token.text for event in events] == [""] * (len(ids) - 1) + ["😀"]


def test_last_token_flushes_an_incomplete_character(detokenizer, tokenizer):
    """A stream that ends mid-character loses nothing: the last token carries the rest."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("ok 😀")[:-1]
    _start(detokenizer, key)
    events, _ = _stream(detokenizer, key, ids)
    assert "".join(event.token.text for event in events) == events[-1].generated_text
    assert events[-1].generated_text == tokenizer.decode(ids)


def test_special_tokens_stream_but_stay_out_of_generated_text(detokenizer, tokenizer):
    """EOS streams as special with its text; generated_text skips it (TGI)."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("Hello there") + [EOS_ID]
    _start(detokenizer, key)
    events, finished = _stream(detokenizer, key, ids, "eos_token")
    assert (events[-1].token.text, events[-1].token.special) == ("<|im_end|>", True)
    assert not any(event.token.special for event in events[:-1])
    assert events[-1].generated_text == "Hello there"
    assert events[-1].details.finish_reason == "eos_token"
    assert finished == []


def test_stop_sequence_spanning_tokens_ends_the_request(detokenizer, tokenizer):
    """A stop sequence over several tokens ends the stream right after it; later tokens are dropped."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("The answer is forty-two. Then more text follows here.")
    _start(detokenizer, key, stop=["forty-two."])
    events, finished = _stream(detokenizer, key, ids, None)
    assert finished == [key]
    final = events[-1]
    assert final.generated_text == "The answer is forty-two."
    assert "".join(event.token.text for event in events) == final.generated_text
    assert final.details.finish_reason == "stop_sequence"
    assert final.details.generated_tokens == len(events) < len(ids)
    assert all(not event.is_final for event in events[:-1])


def test_stop_inside_a_token_cuts_that_tokens_text(detokenizer, tokenizer):
    """A stop sequence ending inside a token's text keeps only the text up to it."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("Hello world and more")
    _start(detokenizer, key, stop=["o wo"])
    events, finished = _stream(detokenizer, key, ids, None)
    assert [event.token.text for event in events] == ["Hello", " wo"]
    assert events[-1].generated_text == "Hello wo"
    assert finished == [key]


def test_earliest_of_several_stops_wins(detokenizer, tokenizer):
    """With several stop sequences the text ends after the first one completed."""
    key = RequestKey(b"c", "r")
    _start(detokenizer, key, stop=["zzz", "two", "one"])
    events, _ = _stream(detokenizer, key, tokenizer.encode("zero one two three"), None)
    assert events[-1].generated_text == "zero one"


def test_worker_finish_takes_precedence_over_a_stop_sequence(detokenizer, tokenizer):
    """A token that ends the request by length keeps its reason even if it completes a stop (TGI)."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("Hello world")
    _start(detokenizer, key, stop=["world"])
    events, finished = _stream(detokenizer, key, ids, "length")
    assert events[-1].details.finish_reason == "length"
    assert events[-1].generated_text == "Hello world"
    assert finished == []


def test_final_details_greedy(detokenizer, tokenizer):
    """The last event carries counts, no seed when greedy and no prefill unless asked."""
    key = RequestKey(b"c", "r")
    ids = tokenizer.encode("a b c")
    _start(detokenizer, key, max_new_tokens=3)
    events, _ = _stream(detokenizer, key, ids, "length",
                        prefill_ids=[1, 2], prefill_logprobs=[math.nan, -1.0])
    details = events[-1].details
    assert (details.finish_reason, details.generated_tokens) == ("length", len(ids))
    assert details.input_tokens == len(detokenizer.tokenizer.encode(PROMPT))
    assert (details.seed, details.prefill) == (None, [])
    assert [event.details is None for event in events] == [True] * (len(ids) - 1) + [False]


def test_final_details_sampling_and_prefill(detokenizer, tokenizer):
    """With sampling the seed is reported; decoder_input_details gives prefill texts, first logprob null."""
    key = RequestKey(b"c", "r")
    prompt_ids = tokenizer.encode(PROMPT)
    _start(detokenizer, key, do_sample=True, seed=1234, decoder_input_details=True)
    logprobs = [math.nan] + [-float(i) for i in range(1, len(prompt_ids))]
    events, _ = _stream(detokenizer, key, tokenizer.encode(" ok"), "length",
                        prefill_ids=prompt_ids, prefill_logprobs=logprobs)
    details = events[-1].details
    assert details.seed == 1234
    assert [token.id for token in details.prefill] == prompt_ids
    assert "".join(token.text for token in details.prefill) == PROMPT
    assert [token.logprob for token in details.prefill] == [None] + logprobs[1:]


def test_top_tokens_carry_texts_when_asked(detokenizer, tokenizer):
    """top_n_tokens > 0 streams the worker's top ids as Tokens with texts and special flags."""
    key = RequestKey(b"c", "r")
    top_ids = [tokenizer.encode(" cat")[0], EOS_ID]
    _start(detokenizer, key, top_n_tokens=2)
    events, _ = _stream(detokenizer, key, tokenizer.encode(" cat"), "length",
                        top_ids=top_ids, top_logprobs=[-0.1, -3.0])
    top = events[0].top_tokens
    assert [(t.id, t.text, t.logprob, t.special) for t in top] == [
        (top_ids[0], " cat", -0.1, False), (EOS_ID, "<|im_end|>", -3.0, True)]


def test_one_stream_events_per_client_per_step(detokenizer, tokenizer):
    """A step with requests of two clients yields one StreamEvents per client, in step order."""
    keys = [RequestKey(b"a", "1"), RequestKey(b"b", "1"), RequestKey(b"a", "2")]
    for key in keys:
        _start(detokenizer, key)
    token_id = tokenizer.encode(" yes")[0]
    batch = detokenizer.detokenize(DetokenizeJob([TokenStep(key, Generation(0, token_id, -0.5)) for key in keys]))
    assert sorted(output.client_id for output in batch.outputs) == [b"a", b"b"]
    assert [event.request_id for event in _events(batch, b"a")] == ["1", "2"]
    assert [event.token.text for event in _events(batch, b"b")] == [" yes"]


def test_unknown_and_forgotten_requests_are_skipped(detokenizer, tokenizer):
    """Tokens for keys never encoded here, or forgotten, produce no events and no error."""
    key = RequestKey(b"c", "r")
    _start(detokenizer, key)
    detokenizer.forget([key, RequestKey(b"c", "never")])
    steps = [TokenStep(key, Generation(0, 42, -0.5)), TokenStep(RequestKey(b"x", "y"), Generation(1, 42, -0.5))]
    assert detokenizer.detokenize(DetokenizeJob(steps)) == TextBatch(outputs=[], finished=[])
    assert detokenizer.num_requests == 0


def test_finished_request_state_is_dropped(detokenizer, tokenizer):
    """After its last event a request is forgotten: a late token for it is ignored."""
    key = RequestKey(b"c", "r")
    _start(detokenizer, key, stop=["b"])
    events, finished = _stream(detokenizer, key, tokenizer.encode("a b c d"), None)
    assert finished == [key] and events[-1].generated_text == "a b"
    assert detokenizer.num_requests == 0


def test_a_request_the_worker_failed_ends_with_an_error_event_not_a_text(detokenizer, tokenizer):
    """finish_reason "error" (a grammar failed in the worker): the last event is an error naming
    the reason, with no generated text (never a 200 whose text breaks its grammar)."""
    key = RequestKey(b"c", "r")
    _start(detokenizer, key)
    events, _ = _stream(detokenizer, key, tokenizer.encode("[1, 2"), None)
    failure = Generation(0, 2, -0.1, "error", 9, error="the grammar failed at token 2: too many expressions")
    events += _events(detokenizer.detokenize(DetokenizeJob([TokenStep(key, failure)])), key.client_id)
    assert events[-1].error == failure.error and events[-1].error_type == "generation"
    assert events[-1].generated_text is None and all(e.error is None for e in events[:-1])
    assert detokenizer.num_requests == 0


def test_adopted_request_continues_the_stream(detokenizer, tokenizer):
    """A request adopted from a lost tokenizer streams exactly the texts the original would have."""
    from ztgi.common.messages import Adopt

    key = RequestKey(b"client", "adopted")
    ids = tokenizer.encode(MULTILINGUAL_OUTPUTS[0], add_special_tokens=False)
    _start(detokenizer, key)
    original, _ = _stream(detokenizer, key, ids)
    encoder = Encoder(tokenizer, ParameterLimits(), b"tokenizer-test")
    generate = Generate(key.request_id, PROMPT, None, GenerateParameters())
    successor = Detokenizer(tokenizer)
    successor.adopt(Adopt(encoder.encode(key, generate), generate.parameters, ids[:3]))
    events = []
    for index, token_id in enumerate(ids[3:], start=4):
        step = Generation(0, token_id, -0.25, "length" if index == len(ids) else None, index)
        events += _events(successor.detokenize(DetokenizeJob([TokenStep(key, step)])), key.client_id)
    assert [e.token.text for e in events] == [e.token.text for e in original[3:]]
    assert events[-1].generated_text == original[-1].generated_text == MULTILINGUAL_OUTPUTS[0]


@pytest.mark.parametrize("text", MULTILINGUAL_OUTPUTS + ["<|im_start|>user\nhi<|im_end|>"])
def test_rust_backend_decodes_as_transformers_does(detokenizer, tokenizer, text):
    """The fast path (the tokenizer's Rust backend) gives transformers' text for every window
    the incremental decode asks for, and for top tokens decoded one by one."""
    assert detokenizer.backend is not None
    ids = tokenizer.encode(text, add_special_tokens=False)
    for start in range(len(ids)):
        for stop in range(start, len(ids) + 1):
            window = ids[start:stop]
            assert detokenizer._decode(window) == tokenizer.decode(
                window, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    texts = [token.text for token in detokenizer._tokens(ids, [None] * len(ids))]
    assert texts == tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
