"""Bench flags: load levels from --concurrency, --request-rate and --sweep; bad values named."""

from __future__ import annotations

import pytest

from ztgi.bench.config import BenchConfig
from ztgi.common.config import ConfigError, parse_config


def test_load_levels() -> None:
    """Default one in flight; a rate alone is unbounded; --sweep lists the levels."""
    assert BenchConfig().concurrencies == [1]
    assert BenchConfig(request_rate=2.0).concurrencies == [None]
    assert BenchConfig(concurrency=8, request_rate=2.0).concurrencies == [8]
    assert parse_config(BenchConfig, ["--sweep", "1,4,16,32"]).concurrencies == [1, 4, 16, 32]


def test_flags_parse_into_the_config() -> None:
    """Flags are generated from the fields: --ignore-eos, --duration-s, --backend."""
    config = parse_config(BenchConfig, ["--backend", "openai-chat", "--ignore-eos", "--duration-s", "2.5",
                                        "--input-tokens", "64", "--input-tokens-range", "0.25"])
    assert (config.backend, config.ignore_eos, config.duration_s) == ("openai-chat", True, 2.5)
    assert (config.input_tokens, config.input_tokens_range) == (64, 0.25)


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "vllm"}, "--backend 'vllm' is unknown"),
    ({"url": "localhost:8080"}, "--url 'localhost:8080' must start with http"),
    ({"concurrency": 0}, "--concurrency must be >= 1"),
    ({"request_rate": 0.0}, "--request-rate must be positive"),
    ({"sweep": "1,x"}, "--sweep '1,x' must be comma-separated integers"),
    ({"sweep": "1,4", "concurrency": 2}, "--sweep replaces --concurrency"),
    ({"dataset": "mixed", "input_tokens": 8}, "cannot be combined with --dataset"),
    ({"input_tokens_range": 1.0}, "--input-tokens-range must be in"),
])
def test_bad_values_are_named(kwargs: dict, message: str) -> None:
    """Each invalid value is a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        BenchConfig(**kwargs)
