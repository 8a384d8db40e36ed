"""`ztgi launch` configuration: the whole pipeline on one host."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import ConfigError, require
from ztgi.common.model_source import DEFAULT_MODEL_ID, ModelNotFoundError, check_model_id
from ztgi.common.request_limit import MAX_CONCURRENT_REQUESTS, MAX_IMAGE_PIXELS
from ztgi.common.service_config import LogConfig, RequestLimits
from ztgi.services.gateway.media_limits import MediaLimits
from ztgi.services.gateway.reasoning_parser import check_reasoning_parser
from ztgi.services.scheduler.placement import CACHE_AWARE, PLACEMENTS
from ztgi.services.worker.config import DEFAULT_QUANTIZED_MAX_ROWS, KV_CACHES


@dataclasses.dataclass(frozen=True)
class LaunchConfig(LogConfig, RequestLimits, MediaLimits):
    """Starts the scheduler, tokenizers, workers and gateways as supervised children.

    Settings every service shares (model, limits) reach the children as ZTGI_* environment
    variables, so each child reads exactly the fields its own config has.
    """

    model_id: str = dataclasses.field(default=DEFAULT_MODEL_ID, metadata={
        "help": "smollm2 (the embedded SmolLM2-135M-Instruct), a local model directory, a .gguf file or a Hub id"})
    host: str = dataclasses.field(default="127.0.0.1", metadata={
        "help": "the HTTP address the gateways listen on"})
    port: int = dataclasses.field(default=8080, metadata={
        "help": "the HTTP port the gateways listen on (several gateways share it)"})
    num_workers: int = dataclasses.field(default=1, metadata={
        "help": "model worker processes (each holds the model and its own KV cache)"})
    num_shard: int = dataclasses.field(default=1, metadata={
        "help": "tensor parallelism: each worker serves the model from this many rank processes (TGI's "
                "--num-shard), each holding its share of the weights and KV cache"})
    num_tokenizers: int = dataclasses.field(default=1, metadata={
        "help": "tokenizer processes"})
    num_gateways: int = dataclasses.field(default=1, metadata={
        "help": "HTTP gateway processes"})
    dtype: str = dataclasses.field(default="auto", metadata={
        "help": "the weights' dtype: auto (bfloat16 on a GPU and on a CPU with bfloat16 units, AMX or "
                "avx512_bf16; float32 on other CPUs), float32, bfloat16 or float16"})
    device: str = dataclasses.field(default="auto", metadata={
        "help": "auto (CUDA when torch sees it), cpu or cuda"})
    backend: str = "auto"  # the worker's forward: native (ztgi's own, Llama), transformers, or auto
    kv_cache: str = "auto"  # the worker's KV layout: paged, padded, or auto (paged where it fits)
    quantize: str = "auto"  # worker weights: auto (a GGUF's blocks as stored, else float), gguf, none, int8, int4
    quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS  # with quantize: float weights above these rows
    block_size: int = 16  # paged KV cache: tokens per block
    float32_decode_attention: bool = False  # paged, CPU, bfloat16: the worker's decode attention in float32
    native_kernels: bool = True  # paged, CPU, bfloat16: ztgi's C kernels (attention in place, layer steps)
    step_target_ms: int = 500  # paged: the step length warmup sizes the default token budget for
    speculate: int = 0  # paged: tokens proposed per request per step by prompt lookup, verified in one forward
    draft_model_id: str | None = None  # paged, with speculate: a small model with the same tokenizer proposes instead
    memory_budget_mb: int | None = dataclasses.field(default=None, metadata={
        "help": "the worker's KV cache budget on CPU, in MiB (none: the worker's own default)"})
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS.field()
    max_image_pixels: int = MAX_IMAGE_PIXELS.field()  # the tokenizers' flag
    max_batch_prefill_tokens: int | None = None  # none: each paged worker's measured step size
    max_batch_total_tokens: int | None = dataclasses.field(default=None, metadata={
        "help": "tokens (prompt and generated) of all the requests one worker runs at once; none: what its "
                "KV cache holds, measured at warmup"})
    max_batch_size: int | None = dataclasses.field(default=None, metadata={
        "help": "requests one worker runs at once (none: only the token limits cap it)"})
    waiting_served_ratio: float = dataclasses.field(default=0.3, metadata={
        "help": "waiting requests join a running batch once at least this many times its size are waiting"})
    max_waiting_tokens: int = dataclasses.field(default=20, metadata={
        "help": "decode steps the queue may wait before whatever is waiting joins the running batch"})
    prefix_caching: bool = True  # paged workers reuse the KV blocks of cached prompt prefixes
    placement: str = CACHE_AWARE  # several paged workers: cache-aware or round-robin (the scheduler's flag)
    lora_adapters: str | None = dataclasses.field(default=None, metadata={
        "help": "LoRA adapters served from the start, as name=path[,name=path...] (the scheduler's flag; each "
                "directory readable by the scheduler and every worker): requests name one with `adapter_id` or "
                "OpenAI's `model`; more are loaded at run time with /v1/load_lora_adapter"})
    max_loras: int = dataclasses.field(default=4, metadata={
        "help": "LoRA adapters one worker's batch mixes at most (the scheduler's flag)"})
    max_lora_rank: int = dataclasses.field(default=64, metadata={
        "help": "the largest LoRA rank an adapter may have (the scheduler's flag)"})
    pipeline_decode: bool = False  # the scheduler sends a batch's next Decode before the last answer is back
    run_dir: str | None = dataclasses.field(default=None, metadata={
        "help": "directory of the services' ipc:// sockets (none: a fresh temporary one, removed at exit)"})
    heartbeat_interval_ms: int = dataclasses.field(default=1000, metadata={
        "help": "how often each service tells the scheduler it is alive"})
    heartbeat_misses: int = dataclasses.field(default=5, metadata={
        "help": "heartbeats missed in a row after which a silent peer is dropped"})
    no_worker_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "a queued request fails after waiting this long with no worker to take it"})
    api_key_file: str | None = dataclasses.field(default=None, metadata={
        "help": "the gateways' API key, on the first line of this file (or set ZTGI_API_KEY; a flag "
                "would show in `ps`)"})
    reasoning_parser: str | None = dataclasses.field(default=None, metadata={
        "help": "the gateways split answers at `<think>...</think>` into reasoning and content: think "
                "(or vLLM's names deepseek_r1, qwen3)"})
    startup_grace_s: float = dataclasses.field(default=600.0, metadata={
        "help": "while workers start (none ready yet since the scheduler started, or one registered and "
                "warming up), a queued request waits this long for one instead of --no-worker-timeout-s"})
    drain_timeout_s: float = dataclasses.field(default=20.0, metadata={
        "help": "SIGTERM: how long gateways, the scheduler and workers let requests finish"})
    health_window_s: float = dataclasses.field(default=30.0, metadata={
        "help": "/health: a worker quiet this long must pass a one-token canary"})
    startup_timeout_s: float = dataclasses.field(default=600.0, metadata={
        "help": "how long the services may take to become healthy before the launch fails"})
    body_read_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "the gateways answer 408 to a request body not received this fast"})
    shutdown_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "how long a child may take to exit after SIGTERM before a kill"})
    restart: bool = dataclasses.field(default=True, metadata={
        "help": "restart a child that exits (off: stop everything with exit code 1)"})
    restart_backoff_s: float = dataclasses.field(default=1.0, metadata={
        "help": "wait this long before restarting a child that exited"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_limits()
        self.check_media()
        for name in ("num_workers", "num_shard", "num_tokenizers", "num_gateways", "block_size", "step_target_ms"):
            require(getattr(self, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
        require(0 < self.port < 65536, f"--port {self.port} is not a TCP port")
        require(self.draft_model_id is None or self.speculate > 0,
                "--draft-model-id needs --speculate N > 0: the number of tokens the draft proposes per step")
        require(self.quantized_max_rows is None or self.quantized_max_rows >= 1,
                "--quantized-max-rows must be at least 1, or none")
        require(self.kv_cache in KV_CACHES, f"--kv-cache {self.kv_cache!r} must be one of {', '.join(KV_CACHES)}")
        require(self.placement in PLACEMENTS,
                f"--placement {self.placement!r} must be one of {', '.join(PLACEMENTS)}")
        require(self.max_loras > 0, f"--max-loras must be positive, got {self.max_loras}")
        require(self.max_lora_rank > 0, f"--max-lora-rank must be positive, got {self.max_lora_rank}")
        require(self.startup_timeout_s > 0, "--startup-timeout-s must be positive")
        require(self.heartbeat_interval_ms > 0 and self.heartbeat_misses > 0,
                "--heartbeat-interval-ms and --heartbeat-misses must be positive")
        require(self.health_window_s > 0, "--health-window-s must be positive")
        require(self.body_read_timeout_s > 0, "--body-read-timeout-s must be positive")
        require(self.no_worker_timeout_s >= 0 and self.restart_backoff_s >= 0 and self.startup_grace_s >= 0,
                "--no-worker-timeout-s, --startup-grace-s and --restart-backoff-s must be >= 0")
        require(0 <= self.drain_timeout_s < self.shutdown_timeout_s,
                f"--drain-timeout-s ({self.drain_timeout_s:g}) must be >= 0 and less than "
                f"--shutdown-timeout-s ({self.shutdown_timeout_s:g}), or children are killed mid-drain")
        check_reasoning_parser(self.reasoning_parser)
        self.check_models()

    def check_models(self) -> None:
        """A model or draft path that names nothing fails the launch here, before any process starts."""
        for flag, model_id in (("--model-id", self.model_id), ("--draft-model-id", self.draft_model_id)):
            try:
                if model_id is not None:
                    check_model_id(model_id)
            except ModelNotFoundError as exc:
                raise ConfigError(f"{flag} {exc}") from None

    def shared_environment(self, scheduler_url: str) -> dict[str, str]:
        """ZTGI_* variables for every child: the settings more than one service reads."""
        shared_bases = (f.name for base in (LogConfig, RequestLimits, MediaLimits) for f in dataclasses.fields(base))
        names = (*shared_bases, "model_id", "dtype", "device", "backend", "kv_cache", "quantize", "block_size",
                 "quantized_max_rows", "num_shard", "step_target_ms", "speculate", "draft_model_id",
                 "float32_decode_attention", "native_kernels",
                 "memory_budget_mb", "max_concurrent_requests", "max_image_pixels",
                 "max_batch_prefill_tokens", "max_batch_total_tokens", "max_batch_size", "waiting_served_ratio",
                 "max_waiting_tokens",
                 "pipeline_decode", "prefix_caching", "placement", "lora_adapters", "max_loras", "max_lora_rank",
                 "heartbeat_interval_ms", "heartbeat_misses",
                 "no_worker_timeout_s", "startup_grace_s", "drain_timeout_s", "health_window_s", "api_key_file",
                 "reasoning_parser")
        env = {f"ZTGI_{name.upper()}": str(getattr(self, name)) for name in names
               if getattr(self, name) is not None}
        if self.quantized_max_rows is None:  # none is not the worker's default: say it
            env["ZTGI_QUANTIZED_MAX_ROWS"] = "none"
        env["ZTGI_SCHEDULER_URL"] = scheduler_url
        return env
