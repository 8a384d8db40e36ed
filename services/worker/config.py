"""Worker configuration (flags `--x-y`, environment `ZTGI_X_Y`)."""

from __future__ import annotations

import dataclasses

from ztgi.common.config import require
from ztgi.common.model_source import DEFAULT_MODEL_ID
from ztgi.common.service_config import PeerConfig, ReadyFileConfig
from ztgi.services.worker.layers.quantization.options import DEFAULT_QUANTIZED_MAX_ROWS, QUANTIZE
from ztgi.services.worker.padded.options import BACKENDS

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
KV_CACHES = ("auto", "paged", "padded")


@dataclasses.dataclass(frozen=True)
class WorkerConfig(PeerConfig, ReadyFileConfig):
    """One model worker: the model, its cached batches, sampling and token-level stopping.

    `memory_budget_mb` is the KV cache budget on CPU (CUDA measures free memory instead);
    `cpu_warmup_prefill_tokens` caps the warmup batch on CPU (none: TGI's full-size warmup).
    """

    model_id: str = DEFAULT_MODEL_ID
    dtype: str = "auto"
    device: str = "auto"
    backend: str = dataclasses.field(default="auto", metadata={
        "help": "the forward: native (ztgi's own, plain Llama models), transformers (any causal LM), "
                "or auto (native where it fits)"})
    kv_cache: str = dataclasses.field(default="auto", metadata={
        "help": "the KV cache layout: paged (a pool of blocks the scheduler allocates, unpadded batches, "
                "chunked prefill), padded (TGI's first model server), or auto (paged where the model's "
                "forward supports it)"})
    block_size: int = dataclasses.field(default=16, metadata={"help": "paged KV cache: tokens per block"})
    speculate: int = dataclasses.field(default=0, metadata={
        "help": "paged KV cache: propose up to this many tokens per request per step from the request's own "
                "prompt and output (prompt lookup, or the draft model of --draft-model-id) and verify them in "
                "the step's one forward; greedy output is unchanged, sampling keeps its distribution; backs off "
                "on large batches (0: off)"})
    draft_model_id: str | None = dataclasses.field(default=None, metadata={
        "help": "paged KV cache, with --speculate N: a small model with the same tokenizer (a local directory "
                "or .gguf, loaded like the model) proposes the N tokens greedily instead of prompt lookup; it "
                "runs in the worker with a KV pool of its own under the same block tables"})
    step_target_ms: int = dataclasses.field(default=500, metadata={
        "help": "paged KV cache: warmup times a prefill chunk and announces how many tokens fit in a step "
                "of this length; the scheduler's default per-step token budget"})
    quantize: str = dataclasses.field(default="auto", metadata={
        "help": "the linear weights on CPU (native forward): auto (a GGUF's blocks as stored, as gguf, where "
                "they can be served, else float), gguf (a GGUF's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks "
                "multiplied as stored, other types dequantized; no float copy), none (float: a GGUF "
                "dequantized), int8 (one scale per row), int4 (a scale and offset per 32 inputs)"})
    quantized_max_rows: int | None = dataclasses.field(default=DEFAULT_QUANTIZED_MAX_ROWS, metadata={
        "help": "with --quantize int8 or int4: steps of up to this many rows (decode) multiply by the quantized "
                "weights, larger ones (prefill chunks) by a packed float copy kept beside them, faster there (torch's "
                "int8/int4 kernels and the Q8_0 lm_head stop at 8 at most: bfloat16 overtakes them above); "
                "none: the quantized weights for every step and no float copy (the memory quantizing saves)"})
    float32_decode_attention: bool = dataclasses.field(default=False, metadata={
        "help": "paged KV cache on CPU, bfloat16/float16 weights: decode attention in float32 (no faster than "
                "the default's grouped bfloat16 decode attention, BENCHMARKS.md); its logits differ from the "
                "bfloat16 kernel's by rounding, so greedy texts can part from transformers' in bfloat16 at "
                "near-ties"})
    native_kernels: bool = dataclasses.field(default=True, metadata={
        "help": "paged KV cache on CPU, bfloat16: ztgi's C kernels for attention (reading the KV blocks in "
                "place), a Llama layer's elementwise steps and, with --quantize, GGUF block products and whole "
                "decode steps' layers, built at start where the CPU has AVX512-BF16 (and VNNI) and a C "
                "compiler is found (torch's ops elsewhere); with AVX2 alone, the block products in any dtype, "
                "and for a float32 Llama served as GGUF blocks its decode attention, layer steps and whole "
                "decode steps' layers; off: torch's ops always"})
    worker_index: int = dataclasses.field(default=0, metadata={
        "help": "this worker's number among the workers of one model (its log lines and metrics carry it)"})
    num_shard: int = dataclasses.field(default=1, metadata={
        "help": "tensor parallelism: serve the model from this many rank processes (TGI's --num-shard), each "
                "holding its share of every layer's heads and weights and of each KV block, on torch.distributed "
                "(gloo on CPU, NCCL on CUDA); the scheduler sees one worker; on CPU each rank takes its own run "
                "of the cores and its share of --num-threads; the query heads, KV heads (or ranks, where fewer) "
                "and intermediate size must divide by it"})
    shard_timeout_s: float = dataclasses.field(default=300.0, metadata={
        "help": "with --num-shard N > 1: how long a rank waits for its peers at start and in any collective "
                "before the group gives up and exits (a rank that hung or died)"})
    memory_budget_mb: int = 4096
    cpu_warmup_prefill_tokens: int | None = dataclasses.field(default=512, metadata={
        "help": "on CPU, cap the warmup batch at this many prompt tokens (none: TGI's full-size warmup)"})
    num_threads: int | None = dataclasses.field(default=None, metadata={
        "help": "torch's CPU intra-op threads (none: torch's default, every core)"})
    cpu_nice: int = dataclasses.field(default=10, metadata={
        "help": "on CPU, lower the worker's scheduling priority by this much (0: leave it), so the "
                "tokenizer, scheduler and gateway sharing its cores preempt its compute threads at once"})
    cpu_idle_class: bool = dataclasses.field(default=True, metadata={
        "help": "on CPU (Linux), run the worker in the kernel's SCHED_IDLE class: any other task that wakes "
                "on its cores runs at once, where at nice 10 alone it could wait out the worker's time slice"})
    cpu_adaptive_threads: bool = dataclasses.field(default=True, metadata={
        "help": "on CPU: run one intra-op thread fewer (below --num-threads, or every core) per core that other "
                "processes keep busy, checked every second, so a busy neighbour does not stall every kernel's "
                "barrier; off: the thread count stays fixed"})
    drain_timeout_s: float = dataclasses.field(default=30.0, metadata={
        "help": "SIGTERM: the worker takes no new requests and finishes its running ones within this many "
                "seconds (the scheduler hands back at once those that could not finish in time, when another "
                "worker can take them), then exits; a second signal, or 0, exits at once"})
    watermark_gamma: float = dataclasses.field(default=0.5, metadata={
        "help": "watermark: the green fraction of the vocabulary (TGI's WATERMARK_GAMMA)"})
    watermark_delta: float = dataclasses.field(default=2.0, metadata={
        "help": "watermark: the logit bias added to green tokens (TGI's WATERMARK_DELTA)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.drain_timeout_s >= 0, "--drain-timeout-s must be >= 0")
        require(self.dtype in DTYPES, f"--dtype {self.dtype!r} must be one of {', '.join(DTYPES)}")
        require(self.device in DEVICES, f"--device {self.device!r} must be one of {', '.join(DEVICES)}")
        require(self.backend in BACKENDS, f"--backend {self.backend!r} must be one of {', '.join(BACKENDS)}")
        require(self.quantize in QUANTIZE, f"--quantize {self.quantize!r} must be one of {', '.join(QUANTIZE)}")
        require(self.quantized_max_rows is None or self.quantized_max_rows >= 1,
                "--quantized-max-rows must be at least 1, or none")
        require(self.kv_cache in KV_CACHES, f"--kv-cache {self.kv_cache!r} must be one of {', '.join(KV_CACHES)}")
        require(self.block_size >= 1, "--block-size must be >= 1")
        require(0 <= self.speculate <= 16, f"--speculate must be between 0 and 16, got {self.speculate}")
        require(self.draft_model_id is None or self.speculate > 0,
                "--draft-model-id needs --speculate N > 0: the number of tokens the draft proposes per step")
        require(self.step_target_ms >= 1, "--step-target-ms must be >= 1")
        require(self.worker_index >= 0, "--worker-index must be >= 0")
        require(self.num_shard >= 1, f"--num-shard must be >= 1, got {self.num_shard}")
        require(self.shard_timeout_s > 0, "--shard-timeout-s must be positive")
        require(self.memory_budget_mb > 0, "--memory-budget-mb (KV cache budget on CPU) must be positive")
        require(self.cpu_warmup_prefill_tokens is None or self.cpu_warmup_prefill_tokens > 0,
                "--cpu-warmup-prefill-tokens must be positive, or none for TGI's full-size warmup")
        require(0 < self.watermark_gamma < 1, "--watermark-gamma must be > 0 and < 1")
        require(0 <= self.watermark_delta < float("inf"), "--watermark-delta must be finite and >= 0")
        require(self.num_threads is None or self.num_threads > 0, "--num-threads must be positive")
        require(0 <= self.cpu_nice <= 19, "--cpu-nice must be between 0 and 19")
