"""A paged batch: requests whose keys and values live in the pool's blocks, not in the batch.

Each `Sequence` holds its tokens, its block table (given by the scheduler) and how many of its
tokens already have their keys and values in the pool (`num_computed`). A step feeds each
running sequence the tokens it has not computed yet: one for a decoding request; for a request
whose prompt is still being prefilled, the chunk the scheduler asked for (`chunk_len`, None for
the whole rest). With speculation a decoding sequence also feeds its `draft`, the tokens proposed
for after its last one (a draft model keeps keys of its own in a second pool, under the same
block table, for its first `num_draft_computed` tokens). Filter and concatenate move Python
objects and block tables only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence as Seq
from typing import Protocol

import torch

from ztgi.common.messages import AdapterRef, CachedBatch, SeqUpdate, WorkerRequest
from ztgi.services.worker.models.request_checks import BatchModel, chooser_for, require_unique, validate_requests
from ztgi.services.worker.paged.prompt_lookup import PromptLookup
from ztgi.services.worker.sampling.next_token_chooser import NextTokenChooser
from ztgi.services.worker.sampling.stopping_criteria import StoppingCriteria
from ztgi.services.worker.vision.prompt_images import PromptImages


class AdapterLoader(Protocol):
    def require(self, ref: AdapterRef) -> None: ...


class PagedBatchModel(BatchModel, Protocol):
    """What a paged batch reads of its model: a batch model's limits, its pool's block size and
    its LoRA adapters (loaded as requests name them)."""

    block_size: int

    @property
    def lora(self) -> AdapterLoader: ...


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request's state between steps."""

    request: WorkerRequest
    tokens: list[int]  # the prompt (with any tokens generated before a resume), then new tokens
    prompt_len: int
    block_ids: list[int]
    num_computed: int  # tokens whose keys and values are in the pool
    stopping: StoppingCriteria
    chunk_len: int | None  # prompt tokens the next step computes (None: all the rest; 0: none)
    prefill_logprobs: list[float] | None = None  # gathered chunk by chunk when asked for
    prefill_top: tuple[list[list[int]], list[list[float]]] | None = None  # with top_n_tokens: ids, logprobs
    draft: list[int] = dataclasses.field(default_factory=list)  # this step's proposed tokens (speculation)
    lookup: PromptLookup = dataclasses.field(default_factory=PromptLookup)
    acceptance: float = 1.0  # recent share of its proposed tokens that were accepted
    num_draft_computed: int = 0  # tokens whose keys are in the draft model's pool (--draft-model-id)
    pooled: torch.Tensor | None = None  # an embedding request's hidden states pooled so far (paged/pooler.py)
    embedding: bytes | None = None  # its vector once the prompt is computed, sent with its one token
    images: PromptImages | None = None  # its prompt's images (a vision-language model's request)

    @property
    def seq_id(self) -> int:
        return self.request.seq_id

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prompt_len

    def next_span(self) -> tuple[int, int]:
        """Where this step's tokens start and how many there are (0: nothing to run)."""
        if self.stopping.stopped:
            return self.num_computed, 0
        rest = len(self.tokens) - self.num_computed
        if self.is_prefilling and self.chunk_len is not None:
            return self.num_computed, min(rest, self.chunk_len)
        return self.num_computed, rest + len(self.draft)

    def step_tokens(self, start: int, count: int) -> list[int]:
        """The tokens at `[start, start + count)`, the draft's after the last chosen one."""
        if not self.draft:
            return self.tokens[start:start + count]
        return (self.tokens + self.draft)[start:start + count]

    def capacity(self, block_size: int) -> int:
        return len(self.block_ids) * block_size


@dataclasses.dataclass(eq=False)
class PagedBatch:
    """Sequences stepped together; row i of `chooser` is sequence i."""

    batch_id: int
    sequences: list[Sequence]
    chooser: NextTokenChooser
    max_tokens: int

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def seq_ids(self) -> list[int]:
        return [s.seq_id for s in self.sequences]

    @property
    def all_stopped(self) -> bool:
        return all(s.stopping.stopped for s in self.sequences)

    def to_cached(self) -> CachedBatch:
        return CachedBatch(self.batch_id, self.seq_ids, self.max_tokens)

    @classmethod
    def from_requests(cls, requests: Seq[WorkerRequest], batch_id: int, max_tokens: int,
                      model: PagedBatchModel) -> PagedBatch:
        """A batch ready for its first step; ValueError naming a bad request and field."""
        validate_requests(requests, batch_id, model)
        for request in requests:
            _validate_paged(request, model.block_size)
        for request in requests:
            if request.adapter is not None:
                try:
                    model.lora.require(request.adapter)
                except ValueError as exc:
                    raise ValueError(f"request {request.seq_id}: {exc}") from None
        sequences = [Sequence(
            request=r, tokens=list(r.input_ids), prompt_len=len(r.input_ids), block_ids=list(r.block_ids),
            num_computed=r.cache_len, stopping=StoppingCriteria(model.eos_token_ids, r.max_new_tokens, r.ignore_eos),
            chunk_len=r.chunk_len, prefill_logprobs=[math.nan] if r.prefill_logprobs else None,
            prefill_top=([[]], [[]]) if r.prefill_logprobs and r.top_n_tokens else None,
            images=PromptImages(list(r.images)) if r.images else None)
            for r in requests]
        return cls(batch_id, sequences, chooser_for(requests, model.device, model.vocab_size), max_tokens)

    def apply(self, updates: Seq[SeqUpdate]) -> None:
        """Grows block tables and sets prefill chunks; ValueError (nothing changed) for an unknown
        or repeated request."""
        index = {s.seq_id: s for s in self.sequences}
        unknown = [u.seq_id for u in updates if u.seq_id not in index]
        if unknown:
            raise ValueError(f"updates for requests {unknown} that are not in batch {self.batch_id}")
        require_unique([u.seq_id for u in updates])
        for update in updates:
            if update.chunk_len is not None and update.chunk_len < 1:
                raise ValueError(f"request {update.seq_id}: `chunk_len` must be >= 1, got {update.chunk_len}")
        for update in updates:
            sequence = index[update.seq_id]
            sequence.block_ids.extend(update.new_block_ids)
            sequence.chunk_len = update.chunk_len

    def filter(self, seq_ids: Seq[int]) -> PagedBatch | None:
        """The batch of `seq_ids`, in that order; None when empty; ValueError for an unknown id."""
        if not seq_ids:
            return None
        require_unique(seq_ids)
        rows = {rid: i for i, rid in enumerate(self.seq_ids)}
        missing = [rid for rid in seq_ids if rid not in rows]
        if missing:
            raise ValueError(f"requests {missing} are not in batch {self.batch_id}")
        if list(seq_ids) == self.seq_ids:
            return self
        kept = [rows[rid] for rid in seq_ids]
        sequences = [self.sequences[i] for i in kept]
        return PagedBatch(self.batch_id, sequences, self.chooser.select(kept), _max_tokens(sequences))

    @classmethod
    def concatenate(cls, batches: Seq[PagedBatch]) -> PagedBatch:
        """All requests under the first batch's id; no keys or values move."""
        if len(batches) == 1:
            return batches[0]
        sequences = [s for b in batches for s in b.sequences]
        require_unique([s.seq_id for s in sequences])
        chooser = NextTokenChooser.concatenate([b.chooser for b in batches])
        return cls(batches[0].batch_id, sequences, chooser, sum(b.max_tokens for b in batches))

    def token_history(self, rows: Seq[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens so far of `rows`, right-aligned (left-padded) with their mask, for penalties."""
        return histories([self.sequences[i].tokens for i in rows], self.chooser.device)


def histories(token_lists: Seq[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists right-aligned (left-padded) into one tensor, with their mask."""
    width = max(len(tokens) for tokens in token_lists)
    token_ids = torch.zeros((len(token_lists), width), dtype=torch.int64)
    mask = torch.zeros_like(token_ids)
    for row, tokens in enumerate(token_lists):
        token_ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return token_ids.to(device), mask.to(device)


def _validate_paged(request: WorkerRequest, block_size: int) -> None:
    where = f"request {request.seq_id}"
    if not 0 <= request.cache_len < len(request.input_ids):
        raise ValueError(f"{where}: `cache_len` must be >= 0 and below the {len(request.input_ids)} input "
                         f"tokens, got {request.cache_len}")
    if request.chunk_len is not None and request.chunk_len < 1:
        raise ValueError(f"{where}: `chunk_len` must be >= 1, got {request.chunk_len}")
    if request.embed and (request.cache_len or request.num_generated):
        raise ValueError(f"{where}: an embedding request computes its whole prompt: `cache_len` and "
                         f"`num_generated` must be 0, got {request.cache_len} and {request.num_generated}")
    if request.cache_len > len(request.block_ids) * block_size:
        raise ValueError(f"{where}: `cache_len` {request.cache_len} is beyond its {len(request.block_ids)} blocks")


def _max_tokens(sequences: Seq[Sequence]) -> int:
    return sum(len(s.tokens) + s.stopping.num_remaining for s in sequences)
