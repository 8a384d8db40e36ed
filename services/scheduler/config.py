"""Scheduler configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common import curve
from ztgi.common.config import require
from ztgi.common.endpoints import Endpoints
from ztgi.common.request_limit import (
    MAX_BEST_OF,
    MAX_CONCURRENT_REQUESTS,
    MAX_INPUT_TOKENS,
    MAX_STOP_SEQUENCES,
    MAX_TOTAL_TOKENS,
)
from ztgi.common.service_config import ServiceConfig
from ztgi.services.scheduler.placement import CACHE_AWARE, PLACEMENTS

DEFAULT_MAX_BATCH_PREFILL_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class SchedulerConfig(ServiceConfig):
    """The hub: queue, batching limits (TGI's names and defaults), liveness."""

    bind_host: str | None = dataclasses.field(default=None, metadata={
        "help": "tcp only: the interface the scheduler's ports listen on (none: the --scheduler-url host; "
                "0.0.0.0: every interface)"})
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS.field()
    max_batch_prefill_tokens: int | None = dataclasses.field(default=None, metadata={
        "help": "tokens one step may carry: paged workers chunk long prompts to fit it (decodes count "
                "too), padded workers cap a new batch's padded prefill at it; none: what each paged "
                "worker measured at warmup, 4096 for padded ones"})
    max_batch_total_tokens: int | None = None
    max_batch_size: int | None = None
    max_input_tokens: int = MAX_INPUT_TOKENS.field()
    max_total_tokens: int = MAX_TOTAL_TOKENS.field()
    max_best_of: int = MAX_BEST_OF.field()
    max_stop_sequences: int = MAX_STOP_SEQUENCES.field()
    waiting_served_ratio: float = 0.3
    max_waiting_tokens: int = 20
    pipeline_decode: bool = dataclasses.field(default=False, metadata={
        "help": "send a running batch's next Decode before the previous step's answer is back, so the "
                "worker steps back to back (off: one command at a time, as TGI; on a CPU worker the "
                "light services' work then slows the step instead, BENCHMARKS.md); padded workers only: a "
                "paged worker's next step needs the blocks the scheduler grants after each answer"})
    prefix_caching: bool = dataclasses.field(default=True, metadata={
        "help": "paged workers keep full KV blocks indexed by their tokens after use: a request reuses "
                "the longest cached prefix of its input (shared system prompts, earlier chat turns) and "
                "prefills only the rest; with several workers it goes to the one holding its prefix"})
    placement: str = dataclasses.field(default=CACHE_AWARE, metadata={
        "help": "how several paged workers share the queue: cache-aware (a request goes to the worker "
                "holding the longest prefix of its input unless that one is much busier; with prefix "
                "caching off, each worker takes the queue's head) or round-robin (the i-th request to "
                "arrive goes to ready worker i mod n, whatever they cache)"})
    speculate: int = dataclasses.field(default=0, metadata={
        "help": "paged workers propose up to this many tokens per request per step (the workers' own "
                "--speculate): each decoding request gets blocks for them when the pool has them free"})
    lora_adapters: str | None = dataclasses.field(default=None, metadata={
        "help": "LoRA adapters served from the start, as name=path[,name=path...] (TGI's flag; PEFT's "
                "adapter_config.json and adapter_model.safetensors in each directory): requests name one with "
                "`adapter_id` or OpenAI's `model`; more are loaded at run time with /v1/load_lora_adapter"})
    max_loras: int = dataclasses.field(default=4, metadata={
        "help": "LoRA adapters one worker's batch mixes at most: a request for another adapter waits until "
                "one of them has no running request"})
    max_lora_rank: int = dataclasses.field(default=64, metadata={
        "help": "the largest LoRA rank an adapter may have (a larger one is refused when loaded)"})
    heartbeat_interval_ms: int = 1000
    heartbeat_misses: int = 5
    no_worker_timeout_s: float = 30.0
    startup_grace_s: float = dataclasses.field(default=600.0, metadata={
        "help": "while workers start (none ready yet since the scheduler started, or one registered and "
                "warming up), a queued request waits this long for one instead of --no-worker-timeout-s"})
    drain_timeout_s: float = 30.0
    health_window_s: float = 30.0  # healthy while a worker answered a command this recently...
    canary_timeout_s: float = dataclasses.field(default=3.0, metadata={
        "help": "/health: a worker quiet for --health-window-s must answer a one-token canary this fast"})
    curve_secret_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "the scheduler's CURVE keypair (NAME.key_secret from `ztgi keygen`): encrypts every link"})
    curve_client_keys_dir: str | None = dataclasses.field(default=None, metadata={
        "help": "directory of client public keys (*.key): only those clients get in"})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.max_concurrent_requests > 0, "--max-concurrent-requests must be positive")
        require(self.max_input_tokens < self.max_total_tokens,
                f"--max-input-tokens ({self.max_input_tokens}) must be less than --max-total-tokens "
                f"({self.max_total_tokens})")
        if self.max_batch_prefill_tokens is not None:
            require(self.max_batch_prefill_tokens >= self.max_input_tokens,
                    f"--max-batch-prefill-tokens ({self.max_batch_prefill_tokens}) must be >= "
                    f"--max-input-tokens ({self.max_input_tokens})")
        if self.max_batch_total_tokens is not None:
            require(self.max_batch_total_tokens >= self.max_total_tokens,
                    f"--max-batch-total-tokens ({self.max_batch_total_tokens}) must be >= "
                    f"--max-total-tokens ({self.max_total_tokens})")
        if self.max_batch_size is not None:
            require(self.max_batch_size > 0, "--max-batch-size must be positive")
        require(self.placement in PLACEMENTS,
                f"--placement {self.placement!r} must be one of {', '.join(PLACEMENTS)}")
        require(0 <= self.speculate <= 16, f"--speculate must be between 0 and 16, got {self.speculate}")
        require(self.max_loras > 0, f"--max-loras must be positive, got {self.max_loras}")
        require(self.max_lora_rank > 0, f"--max-lora-rank must be positive, got {self.max_lora_rank}")
        require(0.0 <= self.waiting_served_ratio, "--waiting-served-ratio must be >= 0")
        require(self.max_waiting_tokens > 0, "--max-waiting-tokens must be positive")
        require(self.heartbeat_interval_ms > 0 and self.heartbeat_misses > 0,
                "--heartbeat-interval-ms and --heartbeat-misses must be positive")
        require(self.health_window_s > 0 and self.canary_timeout_s > 0,
                "--health-window-s and --canary-timeout-s must be positive")
        require(self.curve_client_keys_dir is None or self.curve_secret_key_file is not None,
                "--curve-client-keys-dir needs --curve-secret-key-file (the scheduler's CURVE keypair)")
        curve.server_keys(self.curve_secret_key_file)  # validates the key file
        curve.check_client_keys_dir(self.curve_client_keys_dir)

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(self.scheduler_url, self.bind_host)

    @property
    def curve_keys(self) -> curve.CurveKeys | None:
        return curve.server_keys(self.curve_secret_key_file)

    @property
    def peer_timeout_s(self) -> float:
        return self.heartbeat_interval_ms * self.heartbeat_misses / 1000.0

    @property
    def padded_prefill_tokens(self) -> int:
        """A padded worker's prefill budget (TGI's default when unset)."""
        return self.max_batch_prefill_tokens or DEFAULT_MAX_BATCH_PREFILL_TOKENS
