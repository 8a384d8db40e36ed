"""`LLM(**engine_options)`: the scheduler's batching limits and the worker's budgets, by the server's
flag names (or vLLM's for the same thing), checked by the services' own config classes."""

from __future__ import annotations

import dataclasses
from typing import Any

from ztgi.common.config import env_default
from ztgi.common.request_limit import MAX_TOTAL_TOKENS
from ztgi.services.scheduler.config import DEFAULT_MAX_BATCH_PREFILL_TOKENS, SchedulerConfig
from ztgi.services.worker.backend import Model
from ztgi.services.worker.config import DEFAULT_QUANTIZED_MAX_ROWS, WorkerConfig

SCHEDULER_OPTIONS = ("max_input_tokens", "max_total_tokens", "max_batch_prefill_tokens", "max_batch_total_tokens",
                     "max_batch_size", "waiting_served_ratio", "max_waiting_tokens", "pipeline_decode",
                     "prefix_caching", "lora_adapters", "max_loras", "max_lora_rank")
SWITCHES = ("pipeline_decode", "prefix_caching", "enable_lora")  # True or False, nothing that merely reads as one
ALWAYS_ON = ("enable_lora",)  # vLLM's switches for what is always on here: accepted, nothing to turn on
WORKER_OPTIONS = ("kv_cache", "block_size", "step_target_ms", "memory_budget_mb", "cpu_warmup_prefill_tokens",
                  "speculate", "draft_model_id", "quantize", "quantized_max_rows", "num_shard")
VLLM_NAMES = {"max_model_len": "max_total_tokens", "max_num_seqs": "max_batch_size",
              "max_num_batched_tokens": "max_batch_prefill_tokens", "speculative_model": "draft_model_id",
              "num_speculative_tokens": "speculate", "enable_prefix_caching": "prefix_caching",
              "tensor_parallel_size": "num_shard"}
ALIASES = {**VLLM_NAMES, "draft_model": "draft_model_id"}
DEFAULT_MAX_TOTAL_TOKENS = MAX_TOTAL_TOKENS.default


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The options given, under the server's names; `scheduler_config` fills in the rest."""

    scheduler: dict[str, Any]
    kv_cache: str = "auto"
    block_size: int = 16
    step_target_ms: int = 250
    memory_budget_mb: int = 4096
    # as a server's workers: ZTGI_CPU_WARMUP_PREFILL_TOKENS where set, else 512
    cpu_warmup_prefill_tokens: int | None = dataclasses.field(
        default_factory=lambda: env_default(WorkerConfig, "cpu_warmup_prefill_tokens"))
    speculate: int = 0
    draft_model_id: str | None = None
    quantize: str = "auto"
    quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS
    num_shard: int = 1  # vLLM's tensor_parallel_size: this process is rank 0 of a worker group

    @classmethod
    def parse(cls, options: dict[str, Any]) -> EngineOptions:
        """TypeError for a name neither the server nor vLLM has, ValueError for a switch that is not
        a bool (both before any model is loaded)."""
        named = {ALIASES.get(name, name): value for name, value in options.items()}
        unknown = sorted(name for name in options
                         if ALIASES.get(name, name) not in SCHEDULER_OPTIONS + WORKER_OPTIONS + ALWAYS_ON)
        if unknown:
            known = ", ".join(SCHEDULER_OPTIONS + WORKER_OPTIONS + tuple(ALIASES))
            raise TypeError(f"unknown engine option {', '.join(map(repr, unknown))}; known: {known}")
        for name, value in options.items():  # named as the caller named it
            if ALIASES.get(name, name) in SWITCHES and not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        for name in ALWAYS_ON:
            named.pop(name, None)
        worker = {name: named.pop(name) for name in WORKER_OPTIONS if name in named}
        return cls(named, **worker)

    def scheduler_config(self, model: Model) -> SchedulerConfig:
        """The limits given, the others derived as the server's defaults would allow: the context
        is the model's up to 4096 tokens, a prompt up to one token less, a padded prefill at least one
        prompt (a paged worker chunks prompts: its step budget is what it measured at warmup)."""
        options = {**self.scheduler, "speculate": self.speculate}
        options.setdefault("max_total_tokens", min(DEFAULT_MAX_TOTAL_TOKENS, model.max_position_embeddings))
        options.setdefault("max_input_tokens", options["max_total_tokens"] - 1)
        if model.kv_cache == "padded" and options["max_input_tokens"] > DEFAULT_MAX_BATCH_PREFILL_TOKENS:
            options.setdefault("max_batch_prefill_tokens", options["max_input_tokens"])
        return SchedulerConfig(**options)  # ConfigError (a ValueError) names a bad value
