"""Batching decisions for a paged worker: one step at a time, within a token budget and its blocks.

Each step (vLLM's scheduler, TGI v3's router): every running request that decodes feeds one
token, getting a new block when its next token starts one; prompts being prefilled continue in
chunks; then queued requests are admitted while the step's token budget and the free blocks
allow, a long prompt taking only the part of its prefill that fits (chunked prefill). When a
running request needs a block and none is free, the most recently admitted request is preempted:
its blocks are freed and it goes back to the front of the queue, to resume from prompt + tokens
so far (nothing lost, nothing streamed twice). Decisions only: the batcher sends the commands.
"""

from __future__ import annotations

import dataclasses

from services.scheduler.block_allocator import BlockAllocator
from services.scheduler.config import SchedulerConfig
from services.scheduler.queue import RequestQueue
from services.scheduler.request import Request

RESERVE_FRACTION = 0.01  # admissions leave this share of blocks free for running requests to grow


@dataclasses.dataclass
class PagedStep:
    """What the next command does: preempt `victims` (a Filter), or run one step."""

    victims: list[Request] = dataclasses.field(default_factory=list)
    running: list[Request] = dataclasses.field(default_factory=list)  # stepping, with their chunks
    chunks: dict[int, int | None] = dataclasses.field(default_factory=dict)  # prefill chunk per request id
    admitted: list[Request] = dataclasses.field(default_factory=list)
    num_new: dict[int, int] = dataclasses.field(default_factory=dict)  # KV tokens each computes

    @property
    def is_empty(self) -> bool:
        return not self.victims and not self.num_new


class PagedBatcher:
    """Plans the next step of one paged worker from its running requests and the queue."""

    def __init__(self, config: SchedulerConfig, queue: RequestQueue) -> None:
        self.config = config
        self.queue = queue

    def plan(self, running: list[Request], allocator: BlockAllocator, budget: int, may_admit: bool) -> PagedStep:
        """`running`: the worker's requests in admission order. Allocates the blocks the step needs."""
        step = PagedStep()
        used = self._decodes(step, running, allocator)
        if step.victims:
            return step
        used = self._chunks(step, running, budget, used)
        if may_admit:
            self._admit(step, len(running), allocator, budget, used)
        return step

    def _decodes(self, step: PagedStep, running: list[Request], allocator: BlockAllocator) -> int:
        decoding = [r for r in running if not r.is_prefilling]
        for request in decoding:
            needed = allocator.blocks_for(request.num_computed + 1) - len(request.block_ids)
            if needed > 0:
                blocks = allocator.allocate(needed)
                if blocks is None:
                    step.victims = [max(running, key=lambda r: (r.prefill_started_at, r.request_id))]
                    return 0
                request.block_ids.extend(blocks)
            step.running.append(request)
            step.num_new[request.request_id] = 1
        return len(decoding)

    @staticmethod
    def _chunks(step: PagedStep, running: list[Request], budget: int, used: int) -> int:
        """Prompts already admitted go on (their blocks were taken at admission)."""
        for request in running:
            if not request.is_prefilling or used >= budget:
                continue
            chunk = min(request.prefill_len - request.num_computed, budget - used)
            step.running.append(request)
            step.chunks[request.request_id] = chunk
            step.num_new[request.request_id] = chunk
            used += chunk
        return used

    def _admit(self, step: PagedStep, size: int, allocator: BlockAllocator, budget: int, used: int) -> None:
        """From the front of the queue while tokens, blocks and the batch size allow. A request
        takes the blocks of its whole input at once, so its later chunks never wait for blocks."""
        reserve = int(allocator.num_blocks * RESERVE_FRACTION) if size else 0
        max_size = self.config.max_batch_size
        while self.queue and used < budget and (max_size is None or size < max_size):
            request = self.queue.peek()
            prefill_len = request.input_length
            needed = allocator.blocks_for(prefill_len)
            if needed > allocator.num_free - reserve:
                return
            self.queue.popleft()
            request.block_ids = allocator.allocate(needed) or []
            request.prefill_len, request.num_computed = prefill_len, 0
            chunk = min(prefill_len, budget - used)
            step.admitted.append(request)
            step.chunks[request.request_id] = chunk
            step.num_new[request.request_id] = chunk
            used += chunk
            size += 1
