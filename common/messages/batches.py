"""The worker's side of a request: the requests and batches it steps, what each step outputs, what it reports."""

from __future__ import annotations

import dataclasses

from ztgi.common.codec import record
from ztgi.common.messages.events import FinishReason
from ztgi.common.messages.images import EncodedImage
from ztgi.common.messages.parameters import SamplingParameters

__all__ = ["AdapterRef", "WorkerRequest", "SeqUpdate", "Batch", "CachedBatch", "Generation", "Timings", "WorkerInfo"]


@record
class AdapterRef:
    """A LoRA adapter a request generates with: its name, the directory the worker loads it from
    (PEFT's `adapter_config.json` and `adapter_model.safetensors`) and the scheduler's `generation`
    of that name (a name unloaded and loaded again is a new generation, never mistaken for the old)."""

    name: str
    path: str
    generation: int


@record
class WorkerRequest:
    """One request as the worker sees it: ids in, ids out, no text.

    `seq_id` is the scheduler's integer id for the request (unique per scheduler run).
    On a paged worker the scheduler owns the KV blocks (TGI v3's router): `block_ids` is the
    request's block table so far, `cache_len` how many of `input_ids` already have their keys
    and values in those blocks, and `chunk_len` how many of the rest this step computes (None:
    all of them; a longer prompt is prefilled in chunks over several steps).

    `num_generated`: the last that many of `input_ids` are the request's own output from before
    a resume (preemption, a lost worker): the worker replays them through the request's sampling
    state (grammar, seeded generator) so that it continues where it stopped, not from the start.
    """

    seq_id: int
    input_ids: list[int]
    sampling: SamplingParameters
    max_new_tokens: int
    ignore_eos: bool = False
    top_n_tokens: int = 0
    prefill_logprobs: bool = False
    block_ids: list[int] = ()  # type: ignore[assignment]
    cache_len: int = 0
    chunk_len: int | None = None
    num_generated: int = 0
    embed: bool = False  # pool the prompt's final hidden states into `Generation.embedding`
    adapter: AdapterRef | None = None  # the LoRA adapter it generates with; None: the base model
    images: list[EncodedImage] = ()  # type: ignore[assignment]  # its prompt's images: the encoder runs as their spans prefill

    def __post_init__(self) -> None:
        for name in ("block_ids", "images"):
            if isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, list(getattr(self, name)))


@record
class SeqUpdate:
    """A paged step's news about a cached request: blocks added to the end of its block table,
    and, while its prompt is still being prefilled, how many prompt tokens this step computes
    (None: the request decodes one token)."""

    seq_id: int
    new_block_ids: list[int]
    chunk_len: int | None = None


@record
class Batch:
    """A new batch for Prefill; `max_tokens` is its token budget (inputs + new tokens)."""

    batch_id: int
    requests: list[WorkerRequest]
    max_tokens: int


@record
class CachedBatch:
    """The worker's summary of a batch it keeps cached after a step."""

    batch_id: int
    seq_ids: list[int]
    max_tokens: int

    @property
    def size(self) -> int:
        return len(self.seq_ids)


@record
class Generation:
    """One request's output of one step: the chosen token, and on finish the reason.

    `prefill_ids`/`prefill_logprobs` come once, with a request's first token, when asked for
    (the first prefill logprob is NaN: nothing predicts the first prompt token), and with a
    request's `top_n_tokens` each prompt position's likeliest tokens (none for the first).
    `error` says why a request ends with finish_reason "error" (its grammar failed): it gets an
    error event, not a text.
    """

    seq_id: int
    token_id: int
    logprob: float
    finish_reason: FinishReason | None = None
    generated_tokens: int = 0
    seed: int | None = None
    top_ids: list[int] = ()  # type: ignore[assignment]
    top_logprobs: list[float] = ()  # type: ignore[assignment]
    prefill_ids: list[int] | None = None
    prefill_logprobs: list[float] | None = None
    prefill_top_ids: list[list[int]] | None = None
    prefill_top_logprobs: list[list[float]] | None = None
    error: str | None = None
    embedding: bytes | None = None  # an `embed` request's pooled, normalised vector: float32, little-endian

    def __post_init__(self) -> None:
        for name in ("top_ids", "top_logprobs"):
            if isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, list(getattr(self, name)))


@record
class Timings:
    """Where a worker step spent its time, in nanoseconds, and what its speculation proposed and
    how many of those tokens were accepted."""

    forward_ns: int = 0
    decode_ns: int = 0
    concatenate_ns: int = 0
    total_ns: int = 0
    num_proposed: int = 0
    num_accepted: int = 0


@record
class WorkerInfo:
    """What a worker tells the scheduler about its model when it registers."""

    model_id: str
    dtype: str
    device: str
    eos_token_ids: list[int]
    vocab_size: int
    max_position_embeddings: int
    quantize: str = "none"  # --quantize, resolved: gguf (blocks as stored), int8/int4, or none (float)
    draft_model_id: str | None = None  # --draft-model-id: the model proposing tokens, if any
    pooling: str | None = None  # embeddings: last, mean or cls; None: this engine cannot return hidden states
    pooling_error: str | None = None  # why `pooling` is None
    hidden_size: int = 0  # an embedding's length
    matryoshka: bool = False  # the config declares Matryoshka training: a truncated embedding is meaningful
    # LoRA: each linear an adapter may target, by PEFT's module name, as [in_features, out_features]
    # (empty: this engine serves no adapters), over `num_layers` decoder layers
    lora_targets: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    num_layers: int = 0
    vision: bool = False  # the model takes images (a vision-language model)
