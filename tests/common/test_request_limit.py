"""Each request limit is declared once: every config field of that name is its declaration."""

from __future__ import annotations

import dataclasses

import pytest

from ztgi.common.config import ConfigError, parse_config
from ztgi.common.parameters import ParameterLimits
from ztgi.common.request_limit import MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, REQUEST_LIMITS
from ztgi.common.service_config import RequestLimits
from ztgi.services.gateway.config import GatewayConfig
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.tokenizer.config import TokenizerConfig
from ztgi.services.worker.config import WorkerConfig

CONFIGS = (ParameterLimits, RequestLimits, SchedulerConfig, TokenizerConfig, GatewayConfig, LaunchConfig,
           WorkerConfig)
LIMITS_BY_NAME = {limit.name: limit for limit in REQUEST_LIMITS}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda cls: cls.__name__)
def test_every_limit_field_is_the_shared_declaration(cls: type) -> None:
    """A config that re-declared `max_input_tokens: int = 4095` would fail here."""
    for field in dataclasses.fields(cls):
        if field.name in LIMITS_BY_NAME:
            limit = LIMITS_BY_NAME[field.name]
            assert field.metadata.get("limit") is limit, f"{cls.__name__}.{field.name} is declared again"
            assert (field.default, field.metadata["help"]) == (limit.default, limit.help)


def test_every_declared_limit_is_used_by_some_service() -> None:
    """No declaration is left over: each one is a field of at least one service's config."""
    used = {field.name for cls in CONFIGS[2:] for field in dataclasses.fields(cls)}
    assert {limit.name for limit in REQUEST_LIMITS} <= used


def test_the_shared_default_reaches_flags_and_environment() -> None:
    """One change of the declaration's default would move all of them; today they agree."""
    for cls in (SchedulerConfig, TokenizerConfig, GatewayConfig, LaunchConfig):
        config = parse_config(cls, [])
        assert (config.max_input_tokens, config.max_total_tokens) == (MAX_INPUT_TOKENS.default,
                                                                      MAX_TOTAL_TOKENS.default)


@pytest.mark.parametrize("cls", (SchedulerConfig, TokenizerConfig, GatewayConfig, LaunchConfig),
                         ids=lambda cls: cls.__name__)
def test_the_input_limit_must_stay_below_the_total(cls: type) -> None:
    """Every service refuses the same pair with the same message."""
    with pytest.raises(ConfigError, match=r"--max-input-tokens \(20\) must be less than --max-total-tokens \(20\)"):
        parse_config(cls, ["--max-input-tokens", "20", "--max-total-tokens", "20"])
