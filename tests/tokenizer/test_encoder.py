"""Encoder: text and chat messages to ids, truncation, TGI's limits and messages."""

from __future__ import annotations

import pytest

from ztgi.common.messages import ChatMessage, Generate, GenerateParameters, RequestKey
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.services.tokenizer.encoder import Encoder

KEY = RequestKey(b"client-1", "r1")
TOKENIZER_ID = b"tokenizer-test"


@pytest.fixture
def encoder(tokenizer) -> Encoder:
    return Encoder(tokenizer, ParameterLimits(), TOKENIZER_ID)


def _generate(inputs: str | None = "Hello world", messages=None, **params) -> Generate:
    return Generate("r1", inputs, messages, GenerateParameters(**params))


def _rejection(encoder: Encoder, generate: Generate) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        encoder.encode(KEY, generate)
    return info.value


def test_inputs_encode_like_the_tokenizer(encoder, tokenizer):
    """Raw inputs encode to exactly the tokenizer's ids, with the request's key and owner."""
    encoded = encoder.encode(KEY, _generate("The capital of France is"))
    assert encoded.input_ids == tokenizer.encode("The capital of France is")
    assert (encoded.key, encoded.tokenizer_id) == (KEY, TOKENIZER_ID)


def test_add_special_tokens_follows_parameters(encoder, tokenizer):
    """add_special_tokens=False encodes without the tokenizer's special tokens."""
    text = "<|im_start|>user"
    encoded = encoder.encode(KEY, _generate(text, add_special_tokens=False))
    assert encoded.input_ids == tokenizer.encode(text, add_special_tokens=False)


def test_chat_messages_equal_apply_chat_template(encoder, tokenizer):
    """Chat messages encode exactly like apply_chat_template(..., tokenize=True)."""
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi 😀, 你好?"),
                ChatMessage("assistant", "Hello!"), ChatMessage("user", "Again")]
    expected = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True,
        tokenize=True)["input_ids"]
    encoded = encoder.encode(KEY, _generate(None, messages))
    assert encoded.input_ids == expected
    assert tokenizer.decode(encoded.input_ids).endswith("<|im_start|>assistant\n")


def test_template_error_is_a_validation_error_on_messages(tokenizer):
    """A chat template that raises becomes a ValidationError naming `messages`."""
    strict = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    encoder = Encoder(strict, ParameterLimits(), TOKENIZER_ID)
    error = _rejection(encoder, _generate(None, [ChatMessage("user", "x")]))
    assert error.field == "messages"
    assert str(error) == "Template error: roles must alternate"


def test_empty_inputs_and_messages_are_rejected(encoder):
    """Empty inputs get TGI's message; an empty conversation is rejected too."""
    assert str(_rejection(encoder, _generate(""))) == "`inputs` cannot be empty"
    assert _rejection(encoder, _generate(None, [])).field == "messages"


def test_truncate_keeps_the_last_tokens(encoder, tokenizer):
    """truncate=N keeps the last N prompt tokens (TGI truncates from the left)."""
    text = "one two three four five six seven eight nine ten"
    ids = tokenizer.encode(text)
    encoded = encoder.encode(KEY, _generate(text, truncate=4))
    assert encoded.input_ids == ids[-4:]
    assert encoder.encode(KEY, _generate(text, truncate=1000)).input_ids == ids


def test_max_new_tokens_defaults_to_the_rest_of_the_budget(encoder):
    """Without max_new_tokens the request may use max_total_tokens - input tokens (TGI 2.x)."""
    encoded = encoder.encode(KEY, _generate("Hello world"))
    assert encoded.max_new_tokens == 4096 - len(encoded.input_ids)
    assert encoder.encode(KEY, _generate("Hello world", max_new_tokens=7)).max_new_tokens == 7


def test_too_long_prompt_gets_tgis_input_length_message(tokenizer):
    """A prompt over max_input_tokens is rejected with TGI's message and count."""
    encoder = Encoder(tokenizer, ParameterLimits(max_input_tokens=8, max_total_tokens=100), TOKENIZER_ID)
    text = "word " * 20
    num_tokens = len(tokenizer.encode(text))
    error = _rejection(encoder, _generate(text, max_new_tokens=1))
    assert str(error) == f"`inputs` must have less than 8 tokens. Given: {num_tokens}"


def test_total_tokens_limit_gets_tgis_message(tokenizer):
    """Prompt + max_new_tokens over max_total_tokens is rejected with TGI's message."""
    encoder = Encoder(tokenizer, ParameterLimits(max_input_tokens=8, max_total_tokens=10), TOKENIZER_ID)
    error = _rejection(encoder, _generate("Hello world", max_new_tokens=9))
    assert str(error) == (
        "`inputs` tokens + `max_new_tokens` must be <= 10. Given: 2 `inputs` tokens and 9 `max_new_tokens`")


def test_truncation_happens_before_the_length_checks(tokenizer):
    """A long prompt with truncate within the limit is accepted, truncated."""
    encoder = Encoder(tokenizer, ParameterLimits(max_input_tokens=8, max_total_tokens=16), TOKENIZER_ID)
    encoded = encoder.encode(KEY, _generate("word " * 20, truncate=8))
    assert len(encoded.input_ids) == 8
    assert encoded.max_new_tokens == 8


def test_parameters_are_validated_and_resolved(encoder):
    """Invalid parameters raise TGI's message; valid ones resolve to worker-side values."""
    assert str(_rejection(encoder, _generate(temperature=0.0))) == "`temperature` must be strictly positive"
    encoded = encoder.encode(KEY, _generate(temperature=0.5, seed=3, top_n_tokens=2,
                                            decoder_input_details=True, ignore_eos=True))
    assert encoded.sampling.do_sample and encoded.sampling.seed == 3
    assert (encoded.top_n_tokens, encoded.prefill_logprobs, encoded.ignore_eos) == (2, True, True)
    plain = encoder.encode(KEY, _generate())
    assert (plain.top_n_tokens, plain.prefill_logprobs, plain.sampling.do_sample) == (0, False, False)
