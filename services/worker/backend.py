"""The seam between the engine and a KV-cache layout: what a batch and a model must offer.

Two engines implement it: the paged one (`paged/`: a block pool, unpadded batches, chunked
prefill; the default) and the padded one (`padded/`: TGI's first model server), kept for
comparison and for models the paged forward does not cover. The engine, the batch cache, warmup
and the benchmarks go through these protocols only; `model_loader.py` picks and builds the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch

from ztgi.common.messages import (
    CachedBatch,
    Generation,
    SeqUpdate,
    Timings,
    Warmup,
    WarmupResult,
    WorkerInfo,
    WorkerRequest,
)

BatchT = TypeVar("BatchT", bound="Batch")


class Batch(Protocol):
    """Requests stepped together and their per-request state, cached between commands."""

    batch_id: int

    def __len__(self) -> int: ...

    @property
    def seq_ids(self) -> list[int]: ...

    def to_cached(self) -> CachedBatch: ...

    def apply(self, updates: Sequence[SeqUpdate]) -> None: ...

    def filter(self, seq_ids: Sequence[int]) -> Batch | None: ...


class BatchType(Protocol[BatchT]):
    """A batch class: builds a batch from requests and joins batches (classmethods)."""

    def from_requests(self, requests: Sequence[WorkerRequest], batch_id: int, max_tokens: int,
                      model: Any) -> BatchT: ...

    def concatenate(self, batches: Sequence[BatchT]) -> BatchT: ...


class Model(Protocol, Generic[BatchT]):
    """Weights on a device, and one step of generation over its own kind of batch."""

    kv_cache: ClassVar[str]
    name: str
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: frozenset[int]

    @property
    def batch_type(self) -> BatchType[Any]: ...

    def info(self) -> WorkerInfo: ...

    def warmup(self, command: Warmup, memory_budget_mb: int, cpu_prefill_tokens: int | None,
               step_target_ms: int) -> WarmupResult: ...

    def generate_token(self, batch: BatchT) -> tuple[list[Generation], BatchT | None, Timings]: ...


def new_batch(model: Model, requests: Sequence[WorkerRequest], batch_id: int, max_tokens: int) -> Batch:
    return model.batch_type.from_requests(requests, batch_id, max_tokens, model)
