"""TGI's parameter validation and resolution (`common/parameters.py`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ztgi.common.messages import GenerateParameters, SamplingParameters
from ztgi.common.parameters import (
    ParameterLimits,
    ValidationError,
    resolve_sampling,
    validate_lengths,
    validate_parameters,
)

LIMITS = ParameterLimits()


def _error(**fields) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        validate_parameters(GenerateParameters(**fields), LIMITS)
    return info.value


def test_limits_default_to_tgi_launcher_defaults():
    """The default limits are TGI's launcher defaults."""
    assert dataclasses.astuple(LIMITS) == (2, 4, 5, 4095, 4096)


def test_defaults_are_valid():
    """A request with every parameter left to the server passes."""
    validate_parameters(GenerateParameters(), LIMITS)


@pytest.mark.parametrize("fields, field, message", [
    ({"temperature": 0.0}, "temperature", "`temperature` must be strictly positive"),
    ({"temperature": -1.0}, "temperature", "`temperature` must be strictly positive"),
    ({"temperature": math.nan}, "temperature", "`temperature` must be strictly positive"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "`repetition_penalty` must be strictly positive"),
    ({"frequency_penalty": 2.5}, "frequency_penalty", "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"presence_penalty": 2.5}, "presence_penalty", "`presence_penalty` must be >= -2.0 and <= 2.0"),
    ({"presence_penalty": -2.01}, "presence_penalty", "`presence_penalty` must be >= -2.0 and <= 2.0"),
    ({"top_p": 1.0}, "top_p", "`top_p` must be > 0.0 and < 1.0"),
    ({"top_p": 0.0}, "top_p", "`top_p` must be > 0.0 and < 1.0"),
    ({"typical_p": 1.0}, "typical_p", "`typical_p` must be > 0.0 and < 1.0"),
    ({"top_k": 0}, "top_k", "`top_k` must be strictly positive"),
    ({"max_new_tokens": 0}, "max_new_tokens", "`max_new_tokens` must be strictly positive"),
    ({"max_new_tokens": -3}, "max_new_tokens", "`max_new_tokens` must be strictly positive"),
    ({"truncate": 0}, "truncate", "`truncate` must be strictly positive and less than 4095. Given: 0"),
    ({"truncate": 4096}, "truncate", "`truncate` must be strictly positive and less than 4095. Given: 4096"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "`stop` supports up to 4 stop sequences. Given: 5"),
    ({"stop": [""]}, "stop", "`stop` sequences must not be empty"),
    ({"top_n_tokens": 6}, "top_n_tokens", "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
    ({"top_n_tokens": -1}, "top_n_tokens", "`top_n_tokens` must be >= 0 and <= 5. Given: -1"),
    ({"seed": -1}, "seed", "`seed` must be >= 0 and <= 18446744073709551615. Given: -1"),
])
def test_each_invalid_parameter_gets_tgi_message(fields, field, message):
    """Each out-of-range parameter is rejected with TGI's message, naming the field."""
    error = _error(**fields)
    assert (error.field, str(error)) == (field, message)


def test_boundary_values_are_valid():
    """Values at TGI's inclusive bounds pass."""
    validate_parameters(GenerateParameters(
        frequency_penalty=-2.0, presence_penalty=2.0, top_p=0.999, typical_p=0.01, top_k=1, truncate=4095,
        stop=["a", "b", "c", "d"], top_n_tokens=5, seed=2**64 - 1, max_new_tokens=1), LIMITS)


def test_limits_come_from_the_given_limits():
    """Messages quote the configured limits, not the defaults."""
    limits = ParameterLimits(max_stop_sequences=1, max_top_n_tokens=2, max_input_tokens=10, max_total_tokens=20)
    with pytest.raises(ValidationError, match=r"up to 1 stop sequences. Given: 2"):
        validate_parameters(GenerateParameters(stop=["a", "b"]), limits)
    with pytest.raises(ValidationError, match=r"less than 10. Given: 11"):
        validate_parameters(GenerateParameters(truncate=11), limits)


def test_total_tokens_message_is_tgis():
    """Prompt + max_new_tokens over max_total_tokens gets TGI's message, checked first."""
    with pytest.raises(ValidationError) as info:
        validate_lengths(5000, 10, LIMITS)
    assert str(info.value) == (
        "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 5000 `inputs` tokens and 10 `max_new_tokens`")
    assert info.value.field == "max_new_tokens"


def test_input_length_message_is_tgis():
    """A prompt over max_input_tokens (within the total) gets TGI's input-length message."""
    with pytest.raises(ValidationError) as info:
        validate_lengths(4096, 0, LIMITS)
    assert str(info.value) == "`inputs` must have less than 4095 tokens. Given: 4096"
    assert info.value.field == "inputs"
    validate_lengths(4095, 1, LIMITS)


def test_resolve_defaults_are_greedy_and_neutral():
    """No parameters resolve to greedy with neutral warpers and seed 0."""
    assert resolve_sampling(GenerateParameters()) == SamplingParameters()


@pytest.mark.parametrize("fields", [
    {"temperature": 0.7}, {"top_k": 10}, {"top_p": 0.9}, {"typical_p": 0.5}, {"do_sample": True},
])
def test_non_neutral_warper_turns_sampling_on(fields):
    """Like TGI's NextTokenChooser, any non-neutral warper (or do_sample) samples."""
    assert resolve_sampling(GenerateParameters(**fields)).do_sample


def test_neutral_values_stay_greedy():
    """temperature 1.0 and a repetition penalty alone do not turn sampling on."""
    sampling = resolve_sampling(GenerateParameters(temperature=1.0, repetition_penalty=1.2))
    assert not sampling.do_sample
    assert sampling.repetition_penalty == 1.2


def test_sampling_without_seed_draws_a_random_int63():
    """Sampling without a seed draws a fresh random seed that fits a signed 64-bit int."""
    seeds = {resolve_sampling(GenerateParameters(do_sample=True)).seed for _ in range(8)}
    assert len(seeds) > 1
    assert all(0 <= seed < 2**63 for seed in seeds)


def test_given_seed_and_values_are_kept():
    """A client's seed and warper values pass through unchanged."""
    sampling = resolve_sampling(GenerateParameters(
        do_sample=True, seed=42, temperature=0.5, top_k=7, top_p=0.8, typical_p=0.9,
        frequency_penalty=0.3, watermark=True, presence_penalty=-0.4))
    assert sampling == SamplingParameters(
        temperature=0.5, top_k=7, top_p=0.8, typical_p=0.9, do_sample=True, seed=42,
        repetition_penalty=1.0, frequency_penalty=0.3, watermark=True, presence_penalty=-0.4)
