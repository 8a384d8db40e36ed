"""Warmup: run the largest batch the limits allow, then size the KV budget.

The synthetic batch fills `max_batch_prefill_tokens` with prompts of `max_input_tokens` tokens
(padding counts, as in the scheduler's budget), each reserving room for the remaining
`max_total_tokens - max_input_tokens` new tokens; it is prefilled, decoded once and dropped.
`max_batch_total_tokens` is the scheduler's value when it sets one; otherwise on CUDA it is 90%
of the memory free after warmup, on CPU `--memory-budget-mb`, in KV cache tokens.

On CPU nothing is measured, so the batch may be capped (`--cpu-warmup-prefill-tokens`): it still
runs every step of the real path, without a full-size prefill that takes half a minute on 2 cores.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch

from ztgi.common.messages import Generation, SamplingParameters, Timings, Warmup, WorkerRequest
from ztgi.services.worker.models.request_checks import BatchModel
from ztgi.services.worker.models.warmup_limits import (
    CUDA_MEMORY_FRACTION,
    TOKEN_STRIDE,
    require_room_for_one_request,
    validate_warmup,
)
from ztgi.services.worker.padded.batch import CausalLMBatch

logger = logging.getLogger(__name__)


class WarmupModel(BatchModel, Protocol):
    """What the warmup runs and measures of a padded model."""

    @property
    def kv_bytes_per_token(self) -> int: ...

    def generate_token(self, batch: CausalLMBatch) -> tuple[list[Generation], CausalLMBatch | None, Timings]: ...


def run_warmup(model: WarmupModel, command: Warmup, memory_budget_mb: int,
               cpu_prefill_tokens: int | None = None) -> int:
    """Runs the warmup batch and returns `max_batch_total_tokens`; ValueError for impossible limits.

    `cpu_prefill_tokens` caps the batch's prefill tokens on CPU (None: the full size, as on CUDA).
    """
    validate_warmup(model, command)
    started = time.monotonic()
    cap = cpu_prefill_tokens if model.device.type == "cpu" else None
    first = warmup_batch(model, command, cap)
    num_requests, num_input_tokens = len(first), first.max_input_length
    batch: CausalLMBatch | None = first
    for _ in range(2):  # prefill, then one decode
        if batch is not None:
            _, batch, _ = model.generate_token(batch)
    del batch
    max_batch_total_tokens = command.max_batch_total_tokens or _kv_capacity(model, memory_budget_mb)
    require_room_for_one_request(max_batch_total_tokens, command)
    logger.info("warmup: %d x %d prompt tokens in %.1f s; max_batch_total_tokens=%d", num_requests,
                num_input_tokens, time.monotonic() - started, max_batch_total_tokens)
    return max_batch_total_tokens


def warmup_batch(model: WarmupModel, command: Warmup, max_prefill_tokens: int | None = None) -> CausalLMBatch:
    """Prompts of max_input_tokens filling max_batch_prefill_tokens, both capped by `max_prefill_tokens`."""
    num_input_tokens, prefill_tokens = command.max_input_tokens, command.max_batch_prefill_tokens
    if max_prefill_tokens is not None:
        num_input_tokens = min(num_input_tokens, max_prefill_tokens)
        prefill_tokens = min(prefill_tokens, max_prefill_tokens)
    num_requests = max(1, prefill_tokens // num_input_tokens)
    max_new_tokens = command.max_total_tokens - command.max_input_tokens
    input_ids = [(i * TOKEN_STRIDE) % model.vocab_size for i in range(num_input_tokens)]
    requests = [WorkerRequest(seq_id=i, input_ids=input_ids, sampling=SamplingParameters(),
                              max_new_tokens=max_new_tokens, ignore_eos=True)
                for i in range(num_requests)]
    max_tokens = num_requests * (num_input_tokens + max_new_tokens)
    return CausalLMBatch.from_requests(requests, batch_id=-1, max_tokens=max_tokens, model=model)


def _kv_capacity(model: WarmupModel, memory_budget_mb: int) -> int:
    """How many tokens of KV cache fit: in free CUDA memory, or in the CPU budget."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
        free, _ = torch.cuda.mem_get_info(model.device)
        free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        return int(free * CUDA_MEMORY_FRACTION) // model.kv_bytes_per_token
    return memory_budget_mb * 2**20 // model.kv_bytes_per_token
