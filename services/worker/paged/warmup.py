"""Warmup of a paged worker: run the real step path, time it, then size and allocate the pool.

The pool gets `max_batch_total_tokens` when the scheduler sets it; otherwise on CUDA 90% of the
memory free after the warmup steps, on CPU `--memory-budget-mb` (a draft model's pool, with as
many blocks, is counted in each block's bytes). A timed prefill chunk sets
`max_step_tokens`, the most tokens one step should carry for a step to take about
`--step-target-ms` on this hardware: the scheduler's chunked-prefill budget defaults to it, so a
long prompt never holds the running streams for longer than that.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

import torch

from ztgi.common.messages import Generation, SamplingParameters, Timings, Warmup, WarmupResult, WorkerRequest
from ztgi.services.worker.models.warmup_limits import (
    CUDA_MEMORY_FRACTION,
    TOKEN_STRIDE,
    require_room_for_one_request,
    validate_warmup,
)
from ztgi.services.worker.paged.batch import PagedBatch, PagedBatchModel
from ztgi.services.worker.shards.shard_rank import ShardRank

logger = logging.getLogger(__name__)

TIMED_CHUNK_TOKENS = 256
MIN_STEP_TOKENS, MAX_STEP_TOKENS = 256, 8192  # decodes count too: a large batch leaves prefill room


class WarmupModel(PagedBatchModel, Protocol):
    """What the warmup runs, measures and sets of a paged model."""

    max_step_tokens: int
    shard: ShardRank | None

    @property
    def bytes_per_block(self) -> int: ...

    @property
    def kv_window(self) -> int | None: ...

    def allocate_pool(self, num_blocks: int) -> None: ...

    def release_pools(self) -> None: ...

    def generate_token(self, batch: PagedBatch) -> tuple[list[Generation], PagedBatch | None, Timings]: ...


def warm_up(model: WarmupModel, command: Warmup, memory_budget_mb: int, cpu_prefill_tokens: int | None,
            step_target_ms: int) -> WarmupResult:
    """Runs the warmup steps, allocates the pool; ValueError for limits the pool cannot meet."""
    validate_warmup(model, command)
    started = time.monotonic()
    prefill_tokens = command.max_batch_prefill_tokens
    if cpu_prefill_tokens is not None and model.device.type == "cpu":
        prefill_tokens = min(prefill_tokens, cpu_prefill_tokens)
    input_len = min(command.max_input_tokens, prefill_tokens)
    num_requests = max(1, prefill_tokens // input_len)
    blocks_each = math.ceil((input_len + 1) / model.block_size)
    model.allocate_pool(num_requests * blocks_each)
    _run(model, _batch(model, num_requests, input_len, blocks_each))
    seconds = _timed_chunk(model, min(TIMED_CHUNK_TOKENS, input_len), blocks_each)
    max_step_tokens = _max_step_tokens(min(TIMED_CHUNK_TOKENS, input_len) / seconds, step_target_ms)
    num_blocks = _pool_blocks(model, command, memory_budget_mb)
    if model.shard is not None:  # one block table addresses every rank's pool: the smallest one's size
        num_blocks, max_step_tokens = model.shard.group.min_ints(num_blocks, max_step_tokens)
    require_room_for_one_request(num_blocks * model.block_size, command)
    model.allocate_pool(num_blocks)
    model.max_step_tokens = max_step_tokens
    logger.info("warmup: %d x %d prompt tokens in %.1f s; KV pool %d blocks of %d tokens; %d tokens a step",
                num_requests, input_len, time.monotonic() - started, num_blocks, model.block_size, max_step_tokens)
    return WarmupResult(command.command_id, num_blocks * model.block_size, num_blocks, model.block_size,
                        max_step_tokens, model.kv_window)


def _batch(model: WarmupModel, num_requests: int, input_len: int, blocks_each: int) -> PagedBatch:
    input_ids = [(i * TOKEN_STRIDE) % model.vocab_size for i in range(input_len)]
    requests = [WorkerRequest(seq_id=i, input_ids=input_ids, sampling=SamplingParameters(),
                              max_new_tokens=2, ignore_eos=True,
                              block_ids=list(range(i * blocks_each, (i + 1) * blocks_each)))
                for i in range(num_requests)]
    return PagedBatch.from_requests(requests, batch_id=-1, max_tokens=num_requests * (input_len + 2), model=model)


def _run(model: WarmupModel, batch: PagedBatch | None) -> None:
    """Prefill, then one decode."""
    for _ in range(2):
        if batch is not None:
            _, batch, _ = model.generate_token(batch)


def _timed_chunk(model: WarmupModel, num_tokens: int, blocks_each: int) -> float:
    batch = _batch(model, 1, num_tokens, blocks_each)
    started = time.perf_counter()
    model.generate_token(batch)
    return max(time.perf_counter() - started, 1e-6)


def _max_step_tokens(tokens_per_second: float, step_target_ms: int) -> int:
    return int(min(MAX_STEP_TOKENS, max(MIN_STEP_TOKENS, tokens_per_second * step_target_ms / 1000)))


def _pool_blocks(model: WarmupModel, command: Warmup, memory_budget_mb: int) -> int:
    if command.max_batch_total_tokens:
        return math.ceil(command.max_batch_total_tokens / model.block_size)
    bytes_per_block = model.bytes_per_block
    if model.device.type == "cuda":
        model.release_pools()
        torch.cuda.synchronize(model.device)
        free, _ = torch.cuda.mem_get_info(model.device)
        free += torch.cuda.memory_reserved(model.device) - torch.cuda.memory_allocated(model.device)
        return int(free * CUDA_MEMORY_FRACTION) // bytes_per_block
    return memory_budget_mb * 2**20 // bytes_per_block
