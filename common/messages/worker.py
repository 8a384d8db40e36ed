"""Messages a worker receives: TGI's verbs. Every one carries a `command_id` for the answer."""

from __future__ import annotations

from ztgi.common.codec import message
from ztgi.common.messages.batches import Batch, SeqUpdate

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
    """Prefill a new batch. On a paged worker the step also runs the cached batches named in
    `batch_ids` (their decodes and prefill chunks, with `updates`): one forward for all, and the
    result is cached under the first of `batch_ids` (the new batch's id when there is none)."""

    command_id: int
    batch: Batch
    batch_ids: list[int] = ()  # type: ignore[assignment]
    updates: list[SeqUpdate] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in ("batch_ids", "updates"):
            if isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, list(getattr(self, name)))


@message("decode")
class Decode:
    """One step over the concatenation of these cached batches (cached under the first id);
    `updates` (paged workers) grow block tables and set the next prefill chunks."""

    command_id: int
    batch_ids: list[int]
    updates: list[SeqUpdate] = ()  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if isinstance(self.updates, tuple):
            object.__setattr__(self, "updates", list(self.updates))


@message("filter")
class Filter:
    """Keep only `seq_ids` in the cached batch; an empty list drops it."""

    command_id: int
    batch_id: int
    seq_ids: list[int]


@message("clear")
class Clear:
    """Drop one cached batch, or all of them when `batch_id` is None."""

    command_id: int
    batch_id: int | None


@message("health_check")
class HealthCheck:
    command_id: int
