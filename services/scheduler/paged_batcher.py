"""Batching decisions for a paged worker: one step at a time, within a token budget and its blocks.

Each step (vLLM's scheduler, TGI v3's router): every running request that decodes feeds one
token, getting a new block when its next token starts one; prompts being prefilled continue in
chunks; then queued requests are admitted while the step's token budget and the free blocks
allow, a long prompt taking only the part of its prefill that fits (chunked prefill). When a
running request needs a block and none is free, the most recently admitted request is preempted:
its blocks are freed and it goes back to the front of the queue, to resume from prompt + tokens
so far (nothing lost, nothing streamed twice). With prefix caching a newcomer first takes the
cached blocks of the longest prefix of its input (their tokens compared) and computes only the
rest, at least its last token; the blocks it fills are indexed for the requests after it. A
newcomer whose uncached prefix a prompt being prefilled on the worker is computing right now
(admitted in this step or an earlier one) waits for those blocks to be cached instead of computing
them a second time, as SGLang's in-batch prefix check does: a burst of requests with one new system
prompt computes it once.
With speculation (`speculate`) a decoding request also gets, from free blocks only, room for the
tokens its worker may propose; how many it computes is known from the worker's answer.
With several workers a placement policy says which queued requests are this worker's
(`Placement`: the one holding its prefix unless much busier; or `RoundRobinPlacement`).
Decisions only: the batcher applies them and `WorkerCommands` sends the commands.
"""

from __future__ import annotations

import dataclasses

from ztgi.common.codec import MAX_IMAGE_BYTES_PER_MESSAGE
from ztgi.services.scheduler.block_allocator import BlockAllocator
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.placement import PlacementPolicy
from ztgi.services.scheduler.queue import RequestQueue
from ztgi.services.scheduler.request import Request

RESERVE_FRACTION = 0.01  # admissions leave this share of blocks free for running requests to grow
MAX_SPECULATING_REQUESTS = 8  # the worker's back-off: above this many decodes it proposes nothing
MIN_SHARED_BLOCKS = 2  # a newcomer waits for a prefilling prompt's blocks when it shares this many uncached
MAX_WAITING_SKIPPED = 64  # admission stops after passing over this many such newcomers in one step


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

    def plan(self, running: list[Request], allocator: BlockAllocator, budget: int, may_admit: bool,
             placement: PlacementPolicy | None = None) -> PagedStep:
        """`running`: the worker's requests in admission order. Allocates the blocks the step needs.
        `placement` (several workers) says which queued requests this worker may take."""
        step = PagedStep()
        used = self._decodes(step, running, allocator)
        if step.victims:
            return step
        used = self._chunks(step, running, budget, used)
        if may_admit:
            adapters = {r.adapter.name for r in running if r.adapter is not None}
            self._admit(step, len(running), allocator, budget, used, placement, adapters)
        return step

    def _decodes(self, step: PagedStep, running: list[Request], allocator: BlockAllocator) -> int:
        decoding = [r for r in running if not r.is_prefilling]
        for request in decoding:
            needed = allocator.blocks_for(request.num_computed + 1) - len(request.block_ids)
            if needed > 0:
                blocks = allocator.allocate(needed)
                if blocks is None:
                    step.victims = [max(running, key=lambda r: (r.prefill_started_at, r.seq_id))]
                    return 0
                request.block_ids.extend(blocks)
            step.running.append(request)
            step.num_new[request.seq_id] = 1
        if self.config.speculate and len(decoding) <= MAX_SPECULATING_REQUESTS:
            for request in decoding:
                self._speculative_blocks(request, allocator)
        return len(decoding)

    def _speculative_blocks(self, request: Request, allocator: BlockAllocator) -> None:
        """Blocks for the tokens the worker may propose after the request's next one, when free
        ones are left over (a request never waits or preempts for them; it grows into them)."""
        num_proposed = min(self.config.speculate, request.remaining_new_tokens - 1)
        needed = allocator.blocks_for(request.num_computed + 1 + num_proposed) - len(request.block_ids)
        reserve = int(allocator.num_blocks * RESERVE_FRACTION)
        if needed > 0 and allocator.num_free - needed >= reserve:
            request.block_ids.extend(allocator.allocate(needed) or [])

    @staticmethod
    def _chunks(step: PagedStep, running: list[Request], budget: int, used: int) -> int:
        """Prompts already admitted go on (their blocks were taken at admission)."""
        for request in running:
            if not request.is_prefilling or used >= budget:
                continue
            chunk = min(request.prefill_len - request.num_computed, budget - used)
            step.running.append(request)
            step.chunks[request.seq_id] = chunk
            step.num_new[request.seq_id] = chunk
            used += chunk
        return used

    def _admit(self, step: PagedStep, size: int, allocator: BlockAllocator, budget: int, used: int,
               placement: PlacementPolicy | None, adapters: set[str]) -> None:
        """From the front of the queue while tokens, blocks and the batch size allow (skipping the
        requests `placement` keeps for another worker, and those of a LoRA adapter when the worker
        runs --max-loras others: `adapters` are the ones it runs). A request takes the blocks of its
        whole input at once, so its later chunks never wait for blocks. The Prefill takes images up to
        what one message holds (a request alone may fill it): the next ones wait for the next step."""
        reserve = int(allocator.num_blocks * RESERVE_FRACTION) if size else 0
        image_bytes = 0
        max_size = self.config.max_batch_size
        prefilling = [r for r in step.running if r.seq_id in step.chunks]  # prompts being computed
        num_waiting = 0
        queued = list(self.queue)  # a snapshot: admitted requests leave the queue as we go
        for request in (queued if placement is None else placement.candidates(queued)):
            if used >= budget or (max_size is not None and size >= max_size):
                return
            adapter = request.adapter.name if request.adapter is not None else None
            if adapter is not None and adapter not in adapters and len(adapters) >= self.config.max_loras:
                continue  # waits until one of the worker's adapters has no running request
            if image_bytes and image_bytes + request.image_bytes > MAX_IMAGE_BYTES_PER_MESSAGE:
                return
            prefill_len = request.input_length
            reuses = allocator.cache is not None and self._may_reuse(request)
            tokens = request.cache_tokens
            hit = allocator.match(tokens, request.cache_salt) if reuses else []
            if reuses and _computing_its_prefix(request, len(hit), prefilling, allocator.block_size):
                num_waiting += 1
                if num_waiting > MAX_WAITING_SKIPPED:  # a long queue behind one prefix: look no further
                    return
                continue
            needed = allocator.blocks_for(prefill_len) - len(hit)
            if needed > allocator.num_free - allocator.num_unheld(hit) - reserve:
                return
            self.queue.remove(request)
            allocator.acquire(hit)
            request.block_ids = hit + (allocator.allocate(needed) or [])
            cache_len = len(hit) * allocator.block_size
            request.prefill_len, request.num_computed, request.num_indexed_blocks = prefill_len, cache_len, len(hit)
            if not request.generated_ids:
                request.num_cached_tokens = cache_len
            chunk = min(prefill_len - cache_len, budget - used)
            step.admitted.append(request)
            prefilling.append(request)
            step.chunks[request.seq_id] = chunk
            step.num_new[request.seq_id] = chunk
            used += chunk
            size += 1
            image_bytes += request.image_bytes
            if adapter is not None:
                adapters.add(adapter)

    @staticmethod
    def _may_reuse(request: Request) -> bool:
        """Prefill logprobs need every prompt token's logits, and an embedding (mean or CLS pooled)
        every prompt token's hidden state: such a request computes them all."""
        assert request.encoded is not None
        return not ((request.encoded.prefill_logprobs or request.encoded.embed) and not request.generated_ids)


def _computing_its_prefix(newcomer: Request, num_hit: int, prefilling: list[Request], block_size: int) -> bool:
    """Whether one of the `prefilling` requests (of the newcomer's adapter) is computing the next
    MIN_SHARED_BLOCKS blocks of a newcomer's tokens after its `num_hit` cached ones: the same tokens
    from the start, in blocks of its prompt not yet cached. Waiting a step or two for them then saves
    computing them twice."""
    tokens, salt = newcomer.cache_tokens, newcomer.cache_salt
    end = (num_hit + MIN_SHARED_BLOCKS) * block_size
    if end > len(tokens) - 1:  # match() leaves the last token to compute: nothing to share
        return False
    return any(other.cache_salt == salt and other.num_indexed_blocks * block_size < end <= other.prefill_len
               and other.cache_tokens[:end] == tokens[:end] for other in prefilling)
