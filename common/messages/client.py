"""Messages a client (gateway or direct ZMQ client) receives."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import message, record
from ztgi.common.messages.events import StreamEvent

__all__ = [
    "StreamEvents", "HealthReply", "InfoReply", "StatsReply", "ErrorReply", "MetricSample", "MetricFamily",
    "MetricKind", "SimpleToken", "TokenizeReply", "AdapterReply",
]

MetricKind = Literal["counter", "gauge", "histogram"]


@message("stream_events")
class StreamEvents:
    """Events for one client's requests from one step (one message per client per step)."""

    events: list[StreamEvent]


@message("health_reply")
class HealthReply:
    query_id: str
    healthy: bool
    reason: str


@message("info_reply")
class InfoReply:
    """TGI's /info fields the scheduler knows (the gateway adds its own)."""

    query_id: str
    model_id: str
    model_dtype: str
    model_device_type: str
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    max_batch_total_tokens: int
    max_batch_prefill_tokens: int
    max_waiting_tokens: int
    max_batch_size: int | None
    waiting_served_ratio: float
    num_workers: int
    num_tokenizers: int
    version: str
    kv_cache: str = "padded"  # the workers' KV layout: paged or padded
    block_size: int = 0  # paged: tokens per KV block
    num_blocks: int = 0  # paged: KV blocks over all workers
    speculate: int = 0  # tokens proposed per request per step (TGI's `speculate`)
    placement: str = "cache-aware"  # how several paged workers share the queue (--placement)
    quantize: str = "none"  # the workers' linear weights (--quantize)
    draft_model_id: str | None = None  # the model proposing tokens (--draft-model-id), if any
    pooling: str | None = None  # embeddings: last, mean or cls; None: the workers cannot pool (see pooling_error)
    pooling_error: str | None = None
    hidden_size: int = 0  # an embedding's length
    matryoshka: bool = False  # a truncated embedding (`dimensions`) is meaningful for this model
    lora_adapters: list[str] = ()  # type: ignore[assignment]  # the LoRA adapters requests may name
    max_loras: int = 0  # adapters one worker's batch mixes at most (--max-loras)
    max_lora_rank: int = 0  # the largest adapter rank accepted (--max-lora-rank)
    vision: bool = False  # the model takes images (the workers' WorkerInfo.vision)

    def __post_init__(self) -> None:
        if isinstance(self.lora_adapters, tuple):
            object.__setattr__(self, "lora_adapters", list(self.lora_adapters))


@record
class MetricSample:
    """One labelled value of a metric family; for a histogram, `value` is the sum of the
    observations and `bucket_counts` the count per bucket (not cumulative, the last is +Inf)."""

    labels: dict[str, str]
    value: float
    bucket_counts: list[int] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if isinstance(self.bucket_counts, tuple):
            object.__setattr__(self, "bucket_counts", list(self.bucket_counts))


@record
class MetricFamily:
    """A metric of record as plain data (the gateway renders it for Prometheus).

    `upper_bounds` are a histogram's finite bucket bounds; +Inf is implied.
    """

    name: str
    kind: MetricKind
    help: str
    samples: list[MetricSample]
    upper_bounds: list[float] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if isinstance(self.upper_bounds, tuple):
            object.__setattr__(self, "upper_bounds", list(self.upper_bounds))


@message("stats_reply")
class StatsReply:
    """The scheduler's figures; `families` carries its metrics of record (batches, durations)."""

    query_id: str
    num_queued: int
    num_running: int
    num_workers: int
    num_tokenizers: int
    worker_batch_sizes: dict[str, int]
    worker_requests_served: dict[str, int]
    num_generated_tokens: int
    num_requests_finished: int
    families: list[MetricFamily] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if isinstance(self.families, tuple):
            object.__setattr__(self, "families", list(self.families))


@record
class SimpleToken:
    """A prompt token as TGI's /tokenize shows it: `start`/`stop` are character offsets."""

    id: int
    text: str
    start: int
    stop: int


@message("tokenize_reply")
class TokenizeReply:
    """Answer to TokenizeQuery: the tokens (or for `ids`, their `text`), or `error` and its `error_type`."""

    query_id: str
    tokens: list[SimpleToken]
    error: str | None = None
    error_type: str | None = None
    text: str | None = None


@message("adapter_reply")
class AdapterReply:
    """Answer to LoadAdapter or UnloadAdapter: done, or `error` with its `error_type`: `validation`
    (a bad path, config or shape: 400), `not_found` (no adapter of that name: 404) or `conflict`
    (the name is taken, or requests still use it: 409)."""

    query_id: str
    error: str | None = None
    error_type: str | None = None


@message("error_reply")
class ErrorReply:
    """The scheduler could not understand a frame from this client."""

    error: str
