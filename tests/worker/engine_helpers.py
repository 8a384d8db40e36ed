"""Small builders for engine tests: requests, batches, and running a batch to the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ztgi.common.messages import Generation, SamplingParameters, SeqUpdate, WorkerRequest
from ztgi.services.worker.padded.batch import CausalLMBatch
from ztgi.services.worker.padded.model import PaddedModel as Model


def request(seq_id: int, input_ids: list[int], max_new_tokens: int = 8, *, ignore_eos: bool = False,
            top_n_tokens: int = 0, prefill_logprobs: bool = False, block_ids: Iterable[int] = (),
            chunk_len: int | None = None, embed: bool = False, **sampling: object) -> WorkerRequest:
    return WorkerRequest(seq_id, list(input_ids), SamplingParameters(**sampling), max_new_tokens,
                         ignore_eos, top_n_tokens, prefill_logprobs, list(block_ids), chunk_len=chunk_len,
                         embed=embed)


def batch_of(model: Model, requests: Iterable[WorkerRequest], batch_id: int = 1) -> CausalLMBatch:
    """A batch of the model's own layout (through the backend seam); on a paged model each request
    without blocks gets enough for its prompt and new tokens."""
    requests = list(requests)
    if model.kv_cache == "paged":
        requests = [r if r.block_ids else with_blocks(model, r) for r in requests]
    max_tokens = len(requests) * max(len(r.input_ids) for r in requests) + sum(r.max_new_tokens for r in requests)
    return model.batch_type.from_requests(requests, batch_id, max_tokens, model)


def with_blocks(model, request: WorkerRequest) -> WorkerRequest:
    """The request with a run of the pool's blocks for all its tokens (the tests' allocator: the
    pool is far larger than one test's batches, and runs wrap around)."""
    count = -(-(len(request.input_ids) + request.max_new_tokens) // model.block_size)
    start = _take(count, model.num_blocks)
    return dataclasses.replace(request, block_ids=list(range(start, start + count)))


_cursor = [0]


def _take(count: int, num_blocks: int) -> int:
    if _cursor[0] + count > num_blocks:
        _cursor[0] = 0
    start = _cursor[0]
    _cursor[0] += count
    return start


def step(model: Model, batch: CausalLMBatch, into: dict[int, list[Generation]]) -> CausalLMBatch | None:
    """One generate_token; appends each generation to `into[seq_id]`."""
    generations, next_batch, _ = model.generate_token(batch)
    for generation in generations:
        into.setdefault(generation.seq_id, []).append(generation)
    return next_batch


def run_to_end(model: Model, batch: CausalLMBatch | None,
               into: dict[int, list[Generation]] | None = None) -> dict[int, list[Generation]]:
    """Steps until every request stopped; request id -> its generations in order."""
    into = {} if into is None else into
    while batch is not None:
        batch = step(model, batch, into)
    return into


def token_ids(generations: dict[int, list[Generation]]) -> dict[int, list[int]]:
    return {rid: [g.token_id for g in gens] for rid, gens in generations.items()}


def alone(model: Model, requests: Iterable[WorkerRequest]) -> dict[int, list[int]]:
    """Each request's tokens when it runs in a batch of its own."""
    result: dict[int, list[int]] = {}
    for r in requests:
        result.update(token_ids(run_to_end(model, batch_of(model, [r]))))
    return result


def run_chunked(model: Model, requests: Iterable[WorkerRequest], chunk: int) -> dict[int, list[Generation]]:
    """Every prompt prefilled `chunk` tokens a step (as the scheduler's SeqUpdates ask), then
    decoded to the end; request id -> its generations in order."""
    batch = batch_of(model, [dataclasses.replace(r, chunk_len=chunk) for r in requests])
    into: dict[int, list[Generation]] = {}
    while batch is not None:
        batch = step(model, batch, into)
        if batch is not None:
            batch.apply([SeqUpdate(s.seq_id, [], chunk) for s in batch.sequences if s.is_prefilling])
    return into
