"""TGI's /tokenize in the tokenizer: ids with their text and character offsets in the input."""

from __future__ import annotations

import copy
import threading

import pytest
from tokenizers import processors

from ztgi.common.codec import decode
from ztgi.common.messages import TokenizeJob, TokenizeQuery, TokenizeReply
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.services.tokenizer.config import TokenizerConfig
from ztgi.services.tokenizer.encoder import Encoder
from ztgi.services.tokenizer.service import TokenizerService

TEXT = "Hello world, ça va? 😀 def f(x):\n    return x"


@pytest.fixture
def encoder(tokenizer) -> Encoder:
    return Encoder(tokenizer, ParameterLimits(), b"tokenizer-test")


def test_offsets_slice_the_input_to_each_token_text(encoder, tokenizer) -> None:
    """Every token's text is inputs[start:stop], its ids are the tokenizer's, and ASCII tokens tile the input."""
    tokens = encoder.tokenize(TokenizeQuery("q", TEXT))
    assert [t.id for t in tokens] == tokenizer.encode(TEXT)
    assert all(t.text == TEXT[t.start:t.stop] for t in tokens)
    ascii_part = "Hello world,"
    assert "".join(t.text for t in tokens if t.stop <= len(ascii_part)) == ascii_part
    assert all(tokenizer.decode([t.id]) == t.text for t in tokens if t.stop <= len(ascii_part))
    assert tokens[-1].stop == len(TEXT)


def test_truncate_keeps_the_last_tokens(encoder) -> None:
    """`truncate` keeps the last tokens with their offsets, as generation truncates from the left."""
    tokens = encoder.tokenize(TokenizeQuery("q", TEXT))
    assert encoder.tokenize(TokenizeQuery("q", TEXT, truncate=3)) == tokens[-3:]


def test_add_special_tokens_is_honoured(tokenizer) -> None:
    """With a tokenizer that adds a BOS, add_special_tokens=False leaves it out; added tokens have empty offsets."""
    with_bos = copy.deepcopy(tokenizer)
    with_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    encoder = Encoder(with_bos, ParameterLimits(), b"tokenizer-test")
    special, *rest = encoder.tokenize(TokenizeQuery("q", "Hi there", add_special_tokens=True))
    assert (special.id, special.text, special.start, special.stop) == (0, "", 0, 0)
    assert encoder.tokenize(TokenizeQuery("q", "Hi there", add_special_tokens=False)) == rest


@pytest.mark.parametrize("query, field", [(TokenizeQuery("q", ""), "inputs"),
                                          (TokenizeQuery("q", "Hi", truncate=0), "truncate")])
def test_bad_queries_are_validation_errors(encoder, query, field) -> None:
    """Empty inputs and a non-positive truncate are refused naming the field."""
    with pytest.raises(ValidationError) as caught:
        encoder.tokenize(query)
    assert caught.value.field == field


def test_service_answers_a_job_with_the_reply_for_the_client(tokenizer, tmp_path) -> None:
    """The service's answer is TokenizeDone carrying an encoded TokenizeReply (tokens, or the error)."""
    service = TokenizerService(TokenizerConfig(scheduler_url=f"ipc://{tmp_path}"), tokenizer, threading.Event())
    try:
        done = service.tokenize_text(TokenizeJob(7, TokenizeQuery("q1", "Hello world")))
        failed = service.tokenize_text(TokenizeJob(8, TokenizeQuery("q2", "")))
    finally:
        service.close()
    reply = decode(done.payload, TokenizeReply)
    assert done.job_id == 7 and reply.query_id == "q1" and [t.text for t in reply.tokens] == ["Hello", " world"]
    error = decode(failed.payload, TokenizeReply)
    assert error.tokens == [] and error.error_type == "validation" and "empty" in error.error
