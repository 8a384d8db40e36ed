"""Messages a worker receives: TGI's verbs. Every one carries a `command_id` for the answer."""

from __future__ import annotations

from common.codec import message
from common.messages.records import Batch

__all__ = ["Warmup", "Prefill", "Decode", "Filter", "Clear", "HealthCheck"]


@message("warmup")
class Warmup:
    """Run a batch at these limits and report what the worker can hold."""

    command_id: int
    max_input_tokens: int
    max_total_tokens: int
    max_batch_prefill_tokens: int
    max_batch_total_tokens: int | None


@message("prefill")
class Prefill:
    command_id: int
    batch: Batch


@message("decode")
class Decode:
    """One step over the concatenation of these cached batches (cached under the first id)."""

    command_id: int
    batch_ids: list[int]


@message("filter")
class Filter:
    """Keep only `request_ids` in the cached batch; an empty list drops it."""

    command_id: int
    batch_id: int
    request_ids: list[int]


@message("clear")
class Clear:
    """Drop one cached batch, or all of them when `batch_id` is None."""

    command_id: int
    batch_id: int | None


@message("health_check")
class HealthCheck:
    command_id: int
