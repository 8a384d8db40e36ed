"""`ztgi launch` settings: validation and what reaches the children."""

from __future__ import annotations

import pytest

from ztgi.common.config import ConfigError, parse_config
from ztgi.services.launcher.config import LaunchConfig
from ztgi.services.launcher.launcher import Launcher


def test_liveness_and_drain_settings_reach_every_child() -> None:
    """Heartbeat, no-worker, drain and health settings travel as ZTGI_* variables to all children."""
    config = parse_config(LaunchConfig, ["--heartbeat-interval-ms", "200", "--no-worker-timeout-s", "2",
                                         "--drain-timeout-s", "5", "--health-window-s", "3"])
    env = config.shared_environment("ipc:///tmp/x")
    assert env["ZTGI_HEARTBEAT_INTERVAL_MS"] == "200" and env["ZTGI_HEARTBEAT_MISSES"] == "5"
    assert env["ZTGI_NO_WORKER_TIMEOUT_S"] == "2.0" and env["ZTGI_DRAIN_TIMEOUT_S"] == "5.0"
    assert env["ZTGI_HEALTH_WINDOW_S"] == "3.0"


def test_gateways_drain_for_the_drain_timeout(tmp_path) -> None:
    """Each gateway is told to let open streams finish for --drain-timeout-s."""
    launcher = Launcher(LaunchConfig(drain_timeout_s=7.0, run_dir=str(tmp_path)))
    (gateway,) = [child for child in launcher.children if child.service == "gateway"]
    assert gateway.args[gateway.args.index("--shutdown-timeout-s") + 1] == "7.0"


def test_drain_must_end_before_the_kill() -> None:
    """A drain longer than the launcher waits before killing a child is refused with both flags named."""
    with pytest.raises(ConfigError, match="--drain-timeout-s .* --shutdown-timeout-s"):
        LaunchConfig(drain_timeout_s=30.0, shutdown_timeout_s=30.0)


def test_placement_reaches_the_scheduler_and_a_bad_one_is_refused() -> None:
    """`--placement round-robin` travels as ZTGI_PLACEMENT (the scheduler's own flag reads it);
    an unknown policy is refused with the choices named, by the launcher and by the scheduler."""
    from ztgi.services.scheduler.config import SchedulerConfig

    env = parse_config(LaunchConfig, ["--placement", "round-robin"]).shared_environment("ipc:///tmp/x")
    assert env["ZTGI_PLACEMENT"] == "round-robin"
    assert parse_config(SchedulerConfig, []).placement == "cache-aware"
    for cls in (LaunchConfig, SchedulerConfig):
        with pytest.raises(ConfigError, match="--placement 'random' must be one of cache-aware, round-robin"):
            parse_config(cls, ["--placement", "random"])


def test_reasoning_parser_reaches_the_gateways() -> None:
    """`--reasoning-parser qwen3` travels as ZTGI_REASONING_PARSER, which the gateway's config reads;
    none is not sent (answers stay whole)."""
    import argparse

    from ztgi.common.config import config_from_namespace
    from ztgi.services.gateway.config import GatewayConfig

    env = parse_config(LaunchConfig, ["--reasoning-parser", "qwen3"]).shared_environment("ipc:///tmp/x")
    assert env["ZTGI_REASONING_PARSER"] == "qwen3"
    assert config_from_namespace(GatewayConfig, argparse.Namespace(), env).reasoning_parser == "qwen3"
    assert "ZTGI_REASONING_PARSER" not in parse_config(LaunchConfig, []).shared_environment("ipc:///tmp/x")


def test_lora_settings_reach_the_scheduler_and_bad_limits_are_refused() -> None:
    """`--lora-adapters`, `--max-loras` and `--max-lora-rank` travel as ZTGI_* variables the scheduler's
    config reads; no adapters sends none; a limit below 1 is refused by the launcher, naming the flag."""
    import argparse

    from ztgi.common.config import config_from_namespace
    from ztgi.services.scheduler.config import SchedulerConfig

    flags = ["--lora-adapters", "sql=/adapters/sql,chat=/adapters/chat", "--max-loras", "2", "--max-lora-rank", "16"]
    env = parse_config(LaunchConfig, flags).shared_environment("ipc:///tmp/x")
    scheduler = config_from_namespace(SchedulerConfig, argparse.Namespace(), env)
    assert (scheduler.lora_adapters, scheduler.max_loras, scheduler.max_lora_rank) == (
        "sql=/adapters/sql,chat=/adapters/chat", 2, 16)
    assert "ZTGI_LORA_ADAPTERS" not in parse_config(LaunchConfig, []).shared_environment("ipc:///tmp/x")
    for flag in ("--max-loras", "--max-lora-rank"):
        with pytest.raises(ConfigError, match=f"{flag} must be positive, got 0"):
            parse_config(LaunchConfig, [flag, "0"])


def test_image_settings_reach_the_gateways() -> None:
    """`ztgi launch --allowed-media-domains ... --max-images-per-request 2` reach each gateway's config."""
    import argparse

    from ztgi.common.config import config_from_namespace
    from ztgi.services.gateway.config import GatewayConfig

    env = parse_config(LaunchConfig, ["--allowed-media-domains", "example.com,cdn.example.org",
                                      "--max-images-per-request", "2"]).shared_environment("ipc:///tmp/x")
    gateway = config_from_namespace(GatewayConfig, argparse.Namespace(), env)
    assert gateway.allowed_media_domain_list == ("example.com", "cdn.example.org")
    assert (gateway.max_images_per_request, gateway.max_image_bytes) == (2, 20 * 1024 * 1024)
    with pytest.raises(ConfigError, match="--allowed-media-domains: 'http://x' is not a host name"):
        parse_config(LaunchConfig, ["--allowed-media-domains", "http://x"])


def test_a_model_path_that_names_nothing_fails_before_any_process(tmp_path) -> None:
    """A missing path, a .gguf that is not there, a directory without config.json: the flag error
    names the flag and the path; a Hub id is left to the services (they look it up offline)."""
    (tmp_path / "empty").mkdir()
    cases = [(["--model-id", str(tmp_path / "missing")], "--model-id '.*missing' does not exist"),
             (["--model-id", str(tmp_path / "model.gguf")], "--model-id GGUF file '.*model.gguf' does not exist"),
             (["--model-id", str(tmp_path / "empty")], "--model-id directory '.*empty' has no config.json"),
             (["--speculate", "2", "--draft-model-id", str(tmp_path / "draft")], "--draft-model-id '.*draft' does not")]
    for flags, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse_config(LaunchConfig, flags)
    assert parse_config(LaunchConfig, ["--model-id", "HuggingFaceTB/SmolLM2-135M-Instruct"]).model_id.startswith("Hug")
