"""`LocalEngine`: the scheduler's batching loop driving the worker's engine in one process."""

from __future__ import annotations

import pytest

from ztgi.common.messages import Encoded, RequestKey, SamplingParameters
from ztgi.local_engine import EngineError, LocalEngine
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.worker.model_loader import load_model

KV_CACHE = "padded"  # the step counts below are the padded loop's; the paged one is checked at the end


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: str) -> LocalEngine:
    """The tiny random Llama under TGI's default batching limits (context 2048)."""
    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache=KV_CACHE)
    return LocalEngine(model, SchedulerConfig(max_input_tokens=1024, max_total_tokens=2048))


def encoded(name: str, input_ids: list[int], max_new_tokens: int) -> Encoded:
    return Encoded(RequestKey(b"test", name), input_ids, SamplingParameters(), max_new_tokens, ignore_eos=True,
                   top_n_tokens=0, prefill_logprobs=False, tokenizer_id=b"")


def run(engine: LocalEngine) -> tuple[dict[int, list[int]], int]:
    """Steps until nothing is left: request id -> its token ids, and the number of steps taken."""
    tokens: dict[int, list[int]] = {}
    num_steps = 0
    while engine.has_unfinished():
        for generation in engine.step():
            tokens.setdefault(generation.seq_id, []).append(generation.token_id)
        num_steps += 1
    return tokens, num_steps


def test_requests_batch_together_and_finish(tiny_engine: LocalEngine) -> None:
    """Three requests queued together run in one batch: one prefill, decodes, a Filter when one
    ends; each gets exactly its max_new_tokens, and nothing stays cached once all are done."""
    served_before = tiny_engine.slot.num_requests_served
    ids = [tiny_engine.add(encoded(f"r{i}", [5 + i] * (3 + i), n)) for i, n in enumerate((2, 5, 8))]
    tokens, num_steps = run(tiny_engine)
    assert {rid: len(t) for rid, t in tokens.items()} == dict(zip(ids, (2, 5, 8)))
    assert num_steps == 8 + 2  # 8 token steps and a Filter after each of the two early finishes
    assert tiny_engine.slot.num_requests_served - served_before == 3
    assert not tiny_engine.slot.batches and len(tiny_engine.engine.cache) == 0


def test_same_tokens_alone_or_batched(tiny_engine: LocalEngine) -> None:
    """Greedy ids do not depend on what else is in the batch."""
    prompt = [11, 12, 13, 14]
    alone_id = tiny_engine.add(encoded("alone", prompt, 6))
    alone, _ = run(tiny_engine)
    batched_id = tiny_engine.add(encoded("batched", prompt, 6))
    tiny_engine.add(encoded("other", [7] * 9, 3))
    batched, _ = run(tiny_engine)
    assert batched[batched_id] == alone[alone_id]


def test_abort_ends_a_running_request(tiny_engine: LocalEngine) -> None:
    """A request aborted mid-run gives no more tokens and leaves its batch; the other one goes on."""
    keep = tiny_engine.add(encoded("keep", [3, 4, 5], 6))
    drop = tiny_engine.add(encoded("drop", [6, 7], 6))
    tokens: dict[int, list[int]] = {}
    for _ in range(2):  # prefill, one decode
        for generation in tiny_engine.step():
            tokens.setdefault(generation.seq_id, []).append(generation.token_id)
    tiny_engine.abort(drop)
    rest, _ = run(tiny_engine)
    assert len(tokens[drop]) == 2 and drop not in rest
    assert len(tokens[keep]) + len(rest[keep]) == 6


def test_a_request_that_fits_no_batch(tiny_model_dir: str) -> None:
    """A request larger than the prefill budget (possible only past the tokenizer's checks) fails
    the step with EngineError rather than looping forever."""
    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache=KV_CACHE)
    engine = LocalEngine(model, SchedulerConfig(max_input_tokens=16, max_total_tokens=32,
                                                max_batch_prefill_tokens=16))
    engine.add(encoded("huge", [1] * 40, 2))
    with pytest.raises(EngineError, match="fits no batch"):
        engine.step()
    engine.reset()
    assert not engine.has_unfinished()
    engine.add(encoded("small", [1] * 4, 2))
    tokens, _ = run(engine)
    assert [len(t) for t in tokens.values()] == [2]


def test_paged_engine_gives_the_same_tokens(tiny_engine: LocalEngine, tiny_model_dir: str) -> None:
    """A paged worker (the scheduler's block allocator, chunked steps) gives the padded one's greedy ids."""
    model = load_model(tiny_model_dir, dtype="float32", device="cpu", kv_cache="paged")
    paged = LocalEngine(model, SchedulerConfig(max_input_tokens=1024, max_total_tokens=2048))
    prompts = [[5 + i] * (3 + 4 * i) for i in range(3)]
    results = []
    for engine in (tiny_engine, paged):
        ids = [engine.add(encoded(f"p{i}", prompt, 5 + i)) for i, prompt in enumerate(prompts)]
        tokens, _ = run(engine)
        results.append([tokens[request_id] for request_id in ids])
    assert results[0] == results[1]
    assert [len(t) for t in results[1]] == [5, 6, 7]
    assert not paged.has_unfinished() and paged.slot.allocator.num_used == 0
