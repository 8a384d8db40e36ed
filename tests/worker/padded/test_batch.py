"""CausalLMBatch: a request's tokens do not depend on its batch (padding, concatenate, filter)."""

from __future__ import annotations

import pytest

from tests.worker.engine_helpers import alone, batch_of, request, run_to_end, step, token_ids
from ztgi.services.worker.padded.batch import CausalLMBatch

PROMPTS = {
    1: [1, 504, 3458, 282, 4649, 314],
    2: [1, 9690, 30],
    3: [1, 2683, 253, 727, 28, 281, 253, 1345, 3203, 7148, 281, 260, 4022, 282],
    4: [1, 36, 28, 216, 34],
    5: [1, 30, 30, 30, 30, 30, 30, 30, 30],
}
MAX_NEW_TOKENS = {1: 12, 2: 7, 3: 10, 4: 12, 5: 9}


def requests(ids=PROMPTS, **kwargs):
    return [request(rid, PROMPTS[rid], MAX_NEW_TOKENS[rid], ignore_eos=True, **kwargs) for rid in ids]


@pytest.fixture(scope="module")
def expected(tiny_model) -> dict[int, list[int]]:
    """Each request's greedy tokens when it runs alone."""
    return alone(tiny_model, requests())


def test_prefilled_together_equals_alone(tiny_model, expected):
    """Five prompts of different lengths left-padded into one batch give each request its solo tokens."""
    got = token_ids(run_to_end(tiny_model, batch_of(tiny_model, requests())))
    assert got == expected
    assert {rid: len(t) for rid, t in got.items()} == MAX_NEW_TOKENS


def test_concatenated_after_steps_equals_alone(tiny_model, expected):
    """Two batches stepped apart (3 and 1 steps), concatenated and run on give each request its solo tokens."""
    into: dict = {}
    first = batch_of(tiny_model, requests([1, 2]), batch_id=1)
    for _ in range(3):
        first = step(tiny_model, first, into)
    second = step(tiny_model, batch_of(tiny_model, requests([3, 4, 5]), batch_id=2), into)
    merged = CausalLMBatch.concatenate([first, second])
    assert merged.batch_id == 1 and merged.seq_ids == [1, 2, 3, 4, 5]
    assert token_ids(run_to_end(tiny_model, merged, into)) == expected


def test_filtered_midway_equals_alone(tiny_model, expected):
    """Dropping requests after 3 steps (the last rows filling the gaps) leaves the others' tokens unchanged."""
    into: dict = {}
    batch = batch_of(tiny_model, requests())
    for _ in range(3):
        batch = step(tiny_model, batch, into)
    batch = batch.filter([5, 1, 4])
    assert batch.seq_ids == [1, 5, 4]
    got = token_ids(run_to_end(tiny_model, batch, into))
    assert {rid: got[rid] for rid in (1, 4, 5)} == {rid: expected[rid] for rid in (1, 4, 5)}
    assert len(got[3]) == 3  # the dropped ones stopped where they were


def test_concatenate_then_filter_then_concatenate_equals_alone(tiny_model, expected):
    """Requests joining and leaving at different steps (the scheduler's normal life) keep their solo tokens."""
    into: dict = {}
    running = step(tiny_model, batch_of(tiny_model, requests([3]), batch_id=1), into)
    running = step(tiny_model, running, into)
    running = CausalLMBatch.concatenate([running, step(tiny_model, batch_of(tiny_model, requests([2, 4]), 2), into)])
    for _ in range(6):  # request 2 (7 tokens) finishes on the way
        running = step(tiny_model, running, into)
    running = running.filter([rid for rid in running.seq_ids if rid != 2])
    running = CausalLMBatch.concatenate([running, step(tiny_model, batch_of(tiny_model, requests([1, 5]), 3), into)])
    assert token_ids(run_to_end(tiny_model, running, into)) == {rid: expected[rid] for rid in (1, 2, 3, 4, 5)}


def test_smollm2_concatenate_and_filter_equal_alone(smollm2_model):
    """The same invariance holds for the real SmolLM2: concatenated and filtered greedy tokens equal solo ones."""
    reqs = [request(rid, PROMPTS[rid], 8, ignore_eos=True) for rid in (1, 2, 3)]
    want = alone(smollm2_model, reqs)
    into: dict = {}
    first = step(smollm2_model, step(smollm2_model, batch_of(smollm2_model, reqs[:1], 1), into), into)
    merged = CausalLMBatch.concatenate([first, step(smollm2_model, batch_of(smollm2_model, reqs[1:], 2), into)])
    merged = step(smollm2_model, merged, into).filter([3, 1])
    got = token_ids(run_to_end(smollm2_model, merged, into))
    assert got[1] == want[1] and got[3] == want[3]


def test_max_tokens_accounting(tiny_model):
    """max_tokens: the scheduler's value at prefill; after filter rows x padded length + remaining new
    tokens; concatenate adds the padding it introduces."""
    batch = batch_of(tiny_model, requests([1, 2, 3]))
    assert batch.max_tokens == 3 * 14 + 12 + 7 + 10
    batch = step(tiny_model, batch, {})
    filtered = batch.filter([1, 2])
    assert filtered.max_input_length == 7 and filtered.padding_right_offset == 11  # padding of 3 trimmed
    assert filtered.max_tokens == 2 * 7 + 11 + 6
    other = step(tiny_model, batch_of(tiny_model, requests([4]), batch_id=7), {})
    merged = CausalLMBatch.concatenate([filtered, other])
    assert merged.max_input_length == 7
    assert merged.max_tokens == filtered.max_tokens + other.max_tokens + (7 - 6) * 1
    assert merged.to_cached().seq_ids == [1, 2, 4] and merged.to_cached().max_tokens == merged.max_tokens


def test_attention_mask_allocated_for_tokens_to_come(tiny_model):
    """The mask has room for every token still to come, and fills one column per step."""
    batch = batch_of(tiny_model, requests([2, 4]))
    assert tuple(batch.attention_mask.shape) == (2, 5 + 12)
    assert batch.attention_mask.sum(dim=1).tolist() == [3, 5]
    batch = step(tiny_model, batch, {})
    assert tuple(batch.attention_mask.shape) == (2, 5 + 12)
    assert batch.attention_mask.sum(dim=1).tolist() == [4, 6]
    assert batch.position_ids.squeeze(1).tolist() == [3, 5]


def test_filter_edge_cases(tiny_model):
    """Filter: the same ids return the batch itself, an empty list gives None, an unknown id is a
    ValueError naming it and leaves the batch as it was."""
    batch = step(tiny_model, batch_of(tiny_model, requests([1, 2])), {})
    assert batch.filter([1, 2]) is batch
    assert batch.filter([]) is None
    with pytest.raises(ValueError, match=r"\[9\]"):
        batch.filter([1, 9])
    assert batch.seq_ids == [1, 2] and len(batch) == 2


@pytest.mark.parametrize("bad, field", [
    (dict(input_ids=[]), "input_ids"),
    (dict(input_ids=[1, 49152]), "input_ids"),
    (dict(input_ids=[-1]), "input_ids"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=2048), "max_new_tokens"),
    (dict(top_n_tokens=-1), "top_n_tokens"),
])
def test_from_requests_rejects_bad_requests(tiny_model, bad, field):
    """A bad request is a ValueError naming the request and the field."""
    fields = dict(input_ids=[1, 2, 3], max_new_tokens=4, top_n_tokens=0)
    fields.update(bad)
    bad_request = request(8, fields["input_ids"], fields["max_new_tokens"], top_n_tokens=fields["top_n_tokens"])
    with pytest.raises(ValueError, match=rf"request 8: .*{field}"):
        CausalLMBatch.from_requests([request(7, [1, 2]), bad_request], 1, 100, tiny_model)


def test_from_requests_rejects_duplicate_ids(tiny_model):
    """Two requests with one id in a batch are refused."""
    with pytest.raises(ValueError, match="duplicate request ids"):
        CausalLMBatch.from_requests([request(3, [1, 2]), request(3, [4])], 1, 100, tiny_model)
