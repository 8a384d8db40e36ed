"""The worker's verbs in process: answers, failures, and what stays cached after each."""

from __future__ import annotations

import pytest

from tests.worker.engine_helpers import request
from ztgi.common.messages import (
    Batch,
    Clear,
    CommandDone,
    CommandFailed,
    Decode,
    Filter,
    FilterResult,
    HealthCheck,
    Prefill,
    StepResult,
    Timings,
    Warmup,
    WarmupResult,
)
from ztgi.services.worker.engine import Engine
from ztgi.services.worker.heap_trimmer import HeapTrimmer
from ztgi.services.worker.padded.warmup import warmup_batch


@pytest.fixture
def engine(tiny_model) -> Engine:
    return Engine(tiny_model, memory_budget_mb=64)


def prefill(engine: Engine, batch_id: int, *seq_ids: int, max_new_tokens: int = 4) -> StepResult:
    requests = [request(rid, [1, rid + 3, 7], max_new_tokens, ignore_eos=True) for rid in seq_ids]
    result = engine.prefill(Prefill(batch_id * 100, Batch(batch_id, requests, 3 * len(requests) + 4)))
    assert isinstance(result, StepResult), result
    return result


def test_warmup_sizes_the_kv_budget_from_memory_on_cpu(engine, tiny_model):
    """Warmup runs its batch and answers the CPU budget in KV tokens, or the scheduler's value when set."""
    result = engine.warmup(Warmup(1, max_input_tokens=64, max_total_tokens=80, max_batch_prefill_tokens=200,
                                  max_batch_total_tokens=None))
    assert isinstance(result, WarmupResult) and result.command_id == 1
    per_token = 2 * 2 * 2 * 16 * 4  # k and v x layers x kv heads x head dim x float32
    assert tiny_model.kv_bytes_per_token == per_token
    assert result.max_batch_total_tokens == 64 * 2**20 // per_token
    given = engine.warmup(Warmup(2, 64, 80, 200, max_batch_total_tokens=5000))
    assert given == WarmupResult(2, 5000) and len(engine.cache) == 0


def test_cpu_warmup_batch_can_be_capped(tiny_model):
    """Uncapped, the warmup batch fills max_batch_prefill_tokens with max_input_tokens prompts (TGI);
    capped (the CPU default), it is one short prompt with the same room for new tokens."""
    command = Warmup(1, max_input_tokens=1000, max_total_tokens=1040, max_batch_prefill_tokens=4000,
                     max_batch_total_tokens=None)
    full = warmup_batch(tiny_model, command)
    assert (len(full), full.max_input_length, full.padding_right_offset) == (4, 1000, 40)
    capped = warmup_batch(tiny_model, command, max_prefill_tokens=256)
    assert (len(capped), capped.max_input_length, capped.padding_right_offset) == (1, 256, 40)
    result = Engine(tiny_model, 64, cpu_warmup_prefill_tokens=256).warmup(command)
    assert result == WarmupResult(1, 64 * 2**20 // tiny_model.kv_bytes_per_token)


@pytest.mark.parametrize("limits, message", [
    ((64, 64, 200, None), "max_total_tokens"),
    ((64, 80, 32, None), "max_batch_prefill_tokens"),
    ((64, 4096, 200, None), "positions"),
    ((64, 80, 200, 70), "max_total_tokens"),
])
def test_impossible_warmup_fails_with_the_reason(engine, limits, message):
    """Limits the model cannot serve answer CommandFailed saying which limit."""
    result = engine.warmup(Warmup(3, *limits))
    assert isinstance(result, CommandFailed) and message in result.error and result.command_id == 3


def test_prefill_decode_filter_clear(engine):
    """Prefill caches the batch; Decode concatenates under the first id; Filter keeps the listed requests;
    Clear drops batches; every answer carries its command id and the CachedBatch summary."""
    first = prefill(engine, 1, 10, 11)
    assert first.batch.seq_ids == [10, 11] and [g.seq_id for g in first.generations] == [10, 11]
    assert first.timings.forward_ns > 0 and first.timings.total_ns >= first.timings.forward_ns
    prefill(engine, 2, 12)
    decoded = engine.decode(Decode(5, [1, 2]))
    assert decoded.command_id == 5 and decoded.batch.batch_id == 1
    assert decoded.batch.seq_ids == [10, 11, 12] and sorted(engine.cache) == [1]
    assert [g.generated_tokens for g in decoded.generations] == [2, 2, 2]
    filtered = engine.filter(Filter(6, 1, [12, 10]))
    assert isinstance(filtered, FilterResult) and filtered.batch.seq_ids == [10, 12]
    assert engine.filter(Filter(7, 1, [])) == FilterResult(7, None) and len(engine.cache) == 0
    prefill(engine, 3, 13)
    prefill(engine, 4, 14)
    assert engine.clear(Clear(8, 3)) == CommandDone(8) and sorted(engine.cache) == [4]
    assert engine.clear(Clear(9, None)) == CommandDone(9) and len(engine.cache) == 0
    assert engine.health_check(HealthCheck(10)) == CommandDone(10)


def test_last_step_drops_the_batch(engine):
    """When the step finishes every request, the answer has no batch and nothing stays cached."""
    prefill(engine, 1, 10, max_new_tokens=2)
    result = engine.decode(Decode(2, [1]))
    assert result.batch is None and result.generations[0].finish_reason == "length"
    assert len(engine.cache) == 0


def test_decode_of_a_batch_that_ended_answers_an_empty_step(engine):
    """A Decode pipelined behind the step that ended its batch (every request stopped, or a Filter
    kept none) gets an empty answer; with a live batch beside it, only the live one steps. A
    cleared batch is not one that ended: decoding it fails."""
    prefill(engine, 1, 10, max_new_tokens=2)
    assert engine.decode(Decode(2, [1])).batch is None
    assert engine.decode(Decode(3, [1])) == StepResult(3, [], None, Timings())
    prefill(engine, 2, 11)
    assert engine.filter(Filter(4, 2, [])).batch is None
    prefill(engine, 3, 12)
    beside = engine.decode(Decode(5, [2, 3]))
    assert beside.batch.batch_id == 3 and [g.seq_id for g in beside.generations] == [12]
    engine.clear(Clear(6, 3))
    assert "unknown batch" in engine.decode(Decode(7, [3])).error
    prefill(engine, 1, 13)  # an ended id used again (a restarted scheduler numbers from 1) is live
    assert [g.seq_id for g in engine.decode(Decode(8, [1])).generations] == [13]


def test_invalid_prefill_fails_naming_the_field(engine):
    """A Prefill with a bad sampling value fails with CommandFailed naming it and the batch's requests."""
    bad = [request(1, [1, 2]), request(2, [3, 4], do_sample=True, temperature=0.0)]
    result = engine.prefill(Prefill(4, Batch(7, bad, 10)))
    assert isinstance(result, CommandFailed) and result.command_id == 4
    assert "request 2" in result.error and "`temperature`" in result.error
    assert result.seq_ids == [1, 2] and len(engine.cache) == 0


def test_decode_of_an_unknown_batch_changes_nothing(engine):
    """A Decode naming an unknown batch fails, takes no request down, and the named cached batch still decodes."""
    prefill(engine, 1, 10)
    result = engine.decode(Decode(3, [1, 99]))
    assert isinstance(result, CommandFailed) and "99" in result.error and result.seq_ids == []
    assert isinstance(engine.decode(Decode(4, [1])), StepResult)


def test_failed_decode_drops_only_the_batches_it_named(engine):
    """A Decode whose step fails (here two batches share a request id) drops those batches and reports
    their requests; other cached batches stay intact."""
    prefill(engine, 1, 10)
    prefill(engine, 2, 10, 11)
    prefill(engine, 3, 12)
    result = engine.decode(Decode(4, [1, 2]))
    assert isinstance(result, CommandFailed) and "duplicate" in result.error
    assert sorted(result.seq_ids) == [10, 10, 11] and sorted(engine.cache) == [3]
    assert engine.decode(Decode(5, [3])).batch.seq_ids == [12]


def test_prefill_of_a_cached_batch_id_fails(engine):
    """A Prefill reusing a cached batch id is refused and the cached batch is untouched."""
    prefill(engine, 1, 10)
    result = engine.prefill(Prefill(2, Batch(1, [request(20, [1, 2])], 10)))
    assert isinstance(result, CommandFailed) and result.seq_ids == [20]
    assert engine.cache.get(1).seq_ids == [10]


def test_filter_with_unknown_request_fails_and_keeps_the_batch(engine):
    """Filter naming a request not in the batch fails and leaves the batch as it was."""
    prefill(engine, 1, 10, 11)
    result = engine.filter(Filter(2, 1, [10, 42]))
    assert isinstance(result, CommandFailed) and "42" in result.error
    assert engine.cache.get(1).seq_ids == [10, 11]


def test_freed_memory_is_trimmed_after_the_answer_not_by_the_command(engine):
    """A command that frees batch memory only notes it; `release_freed_memory`, run after its answer was sent,
    trims (here with no interval between trims)."""
    engine.heap = HeapTrimmer(min_interval_s=0.0)
    prefill(engine, 1, 1, 2)
    engine.release_freed_memory()
    assert engine.heap.num_trims == 0  # a prefill frees nothing
    assert isinstance(engine.filter(Filter(7, 1, [1])), FilterResult)
    assert engine.heap.num_trims == 0 and engine.heap.pending
    engine.release_freed_memory()
    assert engine.heap.num_trims == 1 and not engine.heap.pending
