"""The paged engine: chunked prefill, joined steps, block tables and their bad inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.worker.engine_helpers import batch_of, request, run_chunked, run_to_end, token_ids, with_blocks
from ztgi.common.messages import Batch, CommandFailed, Decode, Prefill, SeqUpdate, StepResult, Warmup, WarmupResult
from ztgi.services.worker.engine import Engine

PROMPTS = {1: list(range(3, 40)), 2: [5, 6, 7], 3: list(range(100, 121))}


def _requests(**kwargs) -> list:
    return [request(rid, ids, 6, ignore_eos=True, **kwargs) for rid, ids in PROMPTS.items()]



@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_prefill_equals_whole_prefill(tiny_paged_model, chunk):
    """Prompts prefilled in chunks give the same tokens and the same prompt logprobs as in one step."""
    requests = _requests(prefill_logprobs=True)
    whole = run_to_end(tiny_paged_model, batch_of(tiny_paged_model, requests))
    chunked = run_chunked(tiny_paged_model, requests, chunk)
    assert token_ids(chunked) == token_ids(whole)
    for rid in PROMPTS:
        assert chunked[rid][0].prefill_ids == PROMPTS[rid]
        assert chunked[rid][0].prefill_logprobs[1:] == pytest.approx(whole[rid][0].prefill_logprobs[1:], abs=1e-4)
        assert math.isnan(chunked[rid][0].prefill_logprobs[0])


def test_chunked_prefill_equals_padded_backend(tiny_paged_model, tiny_model):
    """The paged engine with chunks gives the padded backend's greedy tokens."""
    requests = _requests()
    assert token_ids(run_chunked(tiny_paged_model, requests, 4)) == token_ids(
        run_to_end(tiny_model, batch_of(tiny_model, requests)))


def test_newcomers_join_running_requests_in_one_step(tiny_paged_model):
    """Through the engine: a Prefill naming the cached batch runs its decodes and the newcomers in
    one forward; everyone's tokens equal their tokens alone, and the batch is cached under the first id."""
    engine = Engine(tiny_paged_model, memory_budget_mb=64)
    first, second = (with_blocks(tiny_paged_model, r) for r in _requests()[:2])
    alone = {**token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [first]))),
             **token_ids(run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [second])))}
    got: dict = {}
    answer = engine.prefill(Prefill(1, Batch(7, [first], 100)))
    for _ in range(2):
        answer = engine.decode(Decode(2, [7]))
    joined = engine.prefill(Prefill(3, Batch(8, [second], 100), [7], []))
    assert isinstance(joined, StepResult) and joined.batch.batch_id == 7 and sorted(joined.batch.seq_ids) == [1, 2]
    assert 8 not in engine.cache
    while answer.batch is not None:
        answer = engine.decode(Decode(4, [7]))
        for g in answer.generations:
            got.setdefault(g.seq_id, []).append(g.token_id)
    assert got[2] == alone[2][1:] and got[1] == alone[1][4:]


def test_too_few_blocks_fail_and_change_nothing(tiny_paged_model):
    """A step whose blocks cannot hold its tokens is a ValueError naming the request; the batch is
    untouched, and once the scheduler sends the block the step runs."""
    block_size = tiny_paged_model.block_size
    prompt = list(range(3, 3 + block_size + 1))  # needs two blocks
    batch = batch_of(tiny_paged_model, [request(5, prompt, 3, block_ids=[10])])
    with pytest.raises(ValueError, match="request 5: its 1 KV blocks hold"):
        tiny_paged_model.generate_token(batch)
    assert batch.sequences[0].num_computed == 0
    batch.apply([SeqUpdate(5, [11], None)])
    generations, _, _ = tiny_paged_model.generate_token(batch)
    assert [g.seq_id for g in generations] == [5]


@pytest.mark.parametrize("fields, message", [
    ({"block_ids": [10**9]}, "block ids must be in"),
    ({"block_ids": [1], "cache_len": 5}, "`cache_len` must be"),
    ({"block_ids": [1], "chunk_len": 0}, "`chunk_len` must be >= 1"),
])
def test_bad_paged_fields_are_rejected(tiny_paged_model, fields, message):
    with pytest.raises(ValueError, match=message):
        batch = batch_of(tiny_paged_model, [dataclasses.replace(request(6, [1, 2, 3], 2), **fields)])
        tiny_paged_model.generate_token(batch)


def test_bad_updates_fail_the_command_and_change_nothing(tiny_paged_model):
    engine = Engine(tiny_paged_model, memory_budget_mb=64)
    engine.prefill(Prefill(1, Batch(3, [with_blocks(tiny_paged_model, request(1, [1, 2, 3], 4))], 10)))
    failed = engine.decode(Decode(2, [3], [SeqUpdate(99, [5], None)]))
    assert isinstance(failed, CommandFailed) and "not in the batches" in failed.error
    failed = engine.decode(Decode(3, [3], [SeqUpdate(1, [], 0)]))
    assert isinstance(failed, CommandFailed) and "`chunk_len` must be >= 1" in failed.error
    assert isinstance(engine.decode(Decode(4, [3])), StepResult)


def test_updates_sent_to_a_padded_worker_fail(tiny_model):
    engine = Engine(tiny_model, memory_budget_mb=64)
    engine.prefill(Prefill(1, Batch(3, [request(1, [1, 2, 3], 4)], 10)))
    failed = engine.decode(Decode(2, [3], [SeqUpdate(1, [5], None)]))
    assert isinstance(failed, CommandFailed) and "padded" in failed.error


def test_warmup_sizes_the_pool_and_the_step(tiny_paged_model):
    """On CPU the pool is the memory budget in blocks; the step size comes from a timed chunk."""
    engine = Engine(tiny_paged_model, memory_budget_mb=1, cpu_warmup_prefill_tokens=64)
    result = engine.warmup(Warmup(1, 100, 200, 400, None))
    assert isinstance(result, WarmupResult)
    blocks = 2**20 // tiny_paged_model.kv_shape.bytes_per_block
    assert (result.num_blocks, result.block_size) == (blocks, tiny_paged_model.block_size)
    assert result.max_batch_total_tokens == blocks * tiny_paged_model.block_size
    assert 256 <= result.max_step_tokens <= 8192
    too_big = engine.warmup(Warmup(2, 100, 200, 400, max_batch_total_tokens=100))
    assert isinstance(too_big, CommandFailed) and "the KV cache holds" in too_big.error
    assert "max_total_tokens (200)" in too_big.error and "--max-total-tokens" in too_big.error
    tiny_paged_model.allocate_pool(2048)  # the other tests' pool
