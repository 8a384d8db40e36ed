"""WorkerConfig: defaults, flags and environment from the fields, and clear errors."""

from __future__ import annotations

import pytest

from ztgi.common.config import ConfigError, parse_config
from ztgi.common.endpoints import DEFAULT_SCHEDULER_URL
from ztgi.common.model_source import DEFAULT_MODEL_ID
from ztgi.services.worker.config import WorkerConfig


def test_defaults():
    """With nothing set the worker serves the embedded model on the default scheduler, dtype/device auto."""
    config = WorkerConfig()
    assert config.scheduler_url == DEFAULT_SCHEDULER_URL and config.model_id == DEFAULT_MODEL_ID
    assert (config.dtype, config.device, config.heartbeat_interval_ms) == ("auto", "auto", 1000)
    assert config.endpoints.connect("workers") == "tcp://127.0.0.1:5554"


def test_flags_override_environment(monkeypatch):
    """`--x-y` flags win over `ZTGI_X_Y` variables, which win over defaults."""
    monkeypatch.setenv("ZTGI_DTYPE", "bfloat16")
    monkeypatch.setenv("ZTGI_MEMORY_BUDGET_MB", "512")
    monkeypatch.delenv("ZTGI_CPU_WARMUP_PREFILL_TOKENS", raising=False)  # tests/conftest.py sets one for servers
    config = parse_config(WorkerConfig, ["--dtype", "float16", "--worker-index", "3"])
    assert (config.dtype, config.memory_budget_mb, config.worker_index) == ("float16", 512, 3)
    assert config.cpu_warmup_prefill_tokens == 512
    assert parse_config(WorkerConfig, ["--cpu-warmup-prefill-tokens", "none"]).cpu_warmup_prefill_tokens is None


@pytest.mark.parametrize("field, value, flag", [
    ("dtype", "float64", "--dtype"), ("device", "tpu", "--device"), ("memory_budget_mb", 0, "--memory-budget-mb"),
    ("heartbeat_interval_ms", 0, "--heartbeat-interval-ms"), ("cpu_warmup_prefill_tokens", 0, "--cpu-warmup"),
    ("worker_index", -1, "--worker-index"),
    ("scheduler_url", "http://x", "scheduler URL"), ("cpu_nice", 20, "--cpu-nice"), ("cpu_nice", -1, "--cpu-nice"),
    ("backend", "onnx", "--backend"),
])
def test_invalid_values_name_the_flag(field, value, flag):
    """A bad value is a ConfigError naming the flag to change."""
    with pytest.raises(ConfigError, match=flag):
        WorkerConfig(**{field: value})
