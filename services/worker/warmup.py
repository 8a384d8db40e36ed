"""Warmup: run the largest batch the limits allow, then size the KV budget.

The synthetic batch fills `max_batch_prefill_tokens` with prompts of `max_input_tokens` tokens
(padding counts, as in the scheduler's budget), each reserving room for the remaining
`max_total_tokens - max_input_tokens` new tokens; it is prefilled, decoded once and dropped.
`max_batch_total_tokens` is the scheduler's value when it sets one; otherwise on CUDA it is 90%
of the memory free after warmup, on CPU `--memory-budget-mb`, in KV cache tokens.
"""

from __future__ import annotations

import logging
import time

import torch

from common.messages import SamplingParameters, Warmup, WorkerRequest
from services.worker.batch import CausalLMBatch
from services.worker.model import Model

logger = logging.getLogger(__name__)

CUDA_MEMORY_FRACTION = 0.9
TOKEN_STRIDE = 7919  # a prime: synthetic prompts cycle through the vocabulary, not one repeated token


def run_warmup(model: Model, command: Warmup, memory_budget_mb: int) -> int:
    """Runs the warmup batch and returns `max_batch_total_tokens`; ValueError for impossible limits."""
    _validate(model, command)
    started = time.monotonic()
    batch: CausalLMBatch | None = warmup_batch(model, command)
    num_requests = len(batch)
    for _ in range(2):  # prefill, then one decode
        if batch is not None:
            _, batch, _ = model.generate_token(batch)
    del batch
    max_batch_total_tokens = command.max_batch_total_tokens or _kv_capacity(model, memory_budget_mb)
    if max_batch_total_tokens < command.max_total_tokens:
        raise ValueError(f"the KV cache holds {max_batch_total_tokens} tokens, less than one request's "
                         f"max_total_tokens ({command.max_total_tokens}): lower --max-total-tokens or "
                         "give the worker more memory (--memory-budget-mb on CPU)")
    logger.info("warmup: %d x %d prompt tokens in %.1f s; max_batch_total_tokens=%d", num_requests,
                command.max_input_tokens, time.monotonic() - started, max_batch_total_tokens)
    return max_batch_total_tokens


def warmup_batch(model: Model, command: Warmup) -> CausalLMBatch:
    num_requests = max(1, command.max_batch_prefill_tokens // command.max_input_tokens)
    max_new_tokens = command.max_total_tokens - command.max_input_tokens
    input_ids = [(i * TOKEN_STRIDE) % model.vocab_size for i in range(command.max_input_tokens)]
    requests = [WorkerRequest(request_id=i, input_ids=input_ids, sampling=SamplingParameters(),
                              max_new_tokens=max_new_tokens, ignore_eos=True)
                for i in range(num_requests)]
    return CausalLMBatch.from_requests(requests, batch_id=-1, max_tokens=num_requests * command.max_total_tokens,
                                       model=model)


def _validate(model: Model, command: Warmup) -> None:
    if command.max_input_tokens < 1:
        raise ValueError(f"`max_input_tokens` must be >= 1, got {command.max_input_tokens}")
    if command.max_total_tokens <= command.max_input_tokens:
        raise ValueError(f"`max_total_tokens` ({command.max_total_tokens}) must be greater than "
                         f"`max_input_tokens` ({command.max_input_tokens})")
    if command.max_batch_prefill_tokens < command.max_input_tokens:
        raise ValueError(f"`max_batch_prefill_tokens` ({command.max_batch_prefill_tokens}) must be >= "
                         f"`max_input_tokens` ({command.max_input_tokens})")
    if command.max_total_tokens > model.max_position_embeddings:
        raise ValueError(f"`max_total_tokens` ({command.max_total_tokens}) exceeds the model's "
                         f"{model.max_position_embeddings} positions")


def _kv_capacity(model: Model, memory_budget_mb: int) -> int:
    """How many tokens of KV cache fit: in free CUDA memory, or in the CPU budget."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
        free, _ = torch.cuda.mem_get_info(model.device)
        free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        return int(free * CUDA_MEMORY_FRACTION) // model.kv_bytes_per_token
    return memory_budget_mb * 2**20 // model.kv_bytes_per_token
