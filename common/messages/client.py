"""Messages a client (gateway or direct ZMQ client) receives."""

from __future__ import annotations

from common.codec import message
from common.messages.records import StreamEvent

__all__ = ["StreamEvents", "HealthReply", "InfoReply", "StatsReply", "ErrorReply"]


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


@message("stats_reply")
class StatsReply:
    query_id: str
    num_queued: int
    num_running: int
    num_workers: int
    num_tokenizers: int
    worker_batch_sizes: dict[str, int]
    worker_requests_served: dict[str, int]
    num_generated_tokens: int
    num_requests_finished: int


@message("error_reply")
class ErrorReply:
    """The scheduler could not understand a frame from this client."""

    error: str
