"""TokenizerConfig: flags and ZTGI_* variables from its fields, checked on construction."""

from __future__ import annotations

import argparse

import pytest

from ztgi.common.config import ConfigError, add_config_arguments, config_from_namespace, parse_config
from ztgi.common.parameters import ParameterLimits
from ztgi.services.tokenizer.config import TokenizerConfig


def test_defaults_are_tgis_limits():
    """The defaults give TGI's launcher limits."""
    assert TokenizerConfig().limits == ParameterLimits()


def test_flags_then_environment():
    """Flags win over ZTGI_* variables, which win over defaults."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TokenizerConfig)
    config = config_from_namespace(
        TokenizerConfig, parser.parse_args(["--max-input-tokens", "10", "--tokenizer-index", "2"]),
        {"ZTGI_MAX_INPUT_TOKENS": "99", "ZTGI_MAX_TOTAL_TOKENS": "20", "ZTGI_MODEL_ID": "/models/x"})
    assert (config.max_input_tokens, config.max_total_tokens, config.tokenizer_index) == (10, 20, 2)
    assert config.model_id == "/models/x"
    assert config.limits.max_input_tokens == 10


@pytest.mark.parametrize("argv, message", [
    (["--max-input-tokens", "4096"], "--max-input-tokens (4096) must be less than --max-total-tokens (4096)"),
    (["--heartbeat-interval-ms", "0"], "--heartbeat-interval-ms must be positive"),
    (["--scheduler-url", "http://x"], "must be ipc:///run/dir or tcp://host:port"),
    (["--max-best-of", "0"], "--max-best-of must be >= 1"),
])
def test_bad_values_name_the_flag(argv, message):
    """A bad value raises ConfigError naming the flag and what is wrong."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(TokenizerConfig, argv)


def test_launch_passes_max_image_pixels_to_tokenizers():
    """`ztgi launch --max-image-pixels N` reaches each tokenizer as ZTGI_MAX_IMAGE_PIXELS."""
    from ztgi.services.launcher.config import LaunchConfig

    env = parse_config(LaunchConfig, ["--max-image-pixels", "1000"]).shared_environment("ipc:///tmp/x")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TokenizerConfig)
    assert config_from_namespace(TokenizerConfig, parser.parse_args([]), env).max_image_pixels == 1000
    assert TokenizerConfig().max_image_pixels == 4096 * 4096
    with pytest.raises(ConfigError, match="--max-image-pixels must be positive"):
        TokenizerConfig(max_image_pixels=0)
