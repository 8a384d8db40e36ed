"""KVCache: preallocated per-layer buffers written in place, grown on demand, copied only on filter/concatenate."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tests.worker.engine_helpers import batch_of, request
from ztgi.services.worker.padded.kv_cache import KVCache, swap_remove_order


def states(num_rows: int, num_positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (num_rows, 3, num_positions, 4)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def test_writes_beyond_capacity_grow_and_keep_the_cache():
    """A write past the capacity doubles the buffers and keeps every committed position."""
    cache = KVCache.allocate(num_layers=1, capacity=3)
    k1, v1 = states(2, 3, seed=1)
    cache.write(0, k1, v1)
    cache.commit(3)
    k2, v2 = states(2, 2, seed=2)
    keys, values = cache.write(0, k2, v2)
    cache.commit(2)
    assert cache.capacity == 6 and cache.keys[0].shape[2] == 6 and cache.length == 5
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, v2], dim=2))


def test_an_uncommitted_write_leaves_the_cache_as_it_was():
    """A forward that fails before commit leaves `length` and the committed positions untouched."""
    cache = KVCache.allocate(num_layers=1, capacity=8)
    k1, v1 = states(1, 2, seed=1)
    cache.write(0, k1, v1)
    cache.commit(2)
    cache.write(0, *states(1, 3, seed=2))
    assert cache.length == 2
    keys, _ = cache.write(0, *states(1, 1, seed=3))
    assert torch.equal(keys[:, :, :2], k1)


def test_concatenate_right_aligns_each_cache_and_zero_pads_before():
    """concatenate right-aligns each cache's live positions in new buffers and zero-pads before."""
    a = KVCache.allocate(num_layers=1, capacity=4)
    ka, va = states(2, 3, seed=1)
    a.write(0, ka, va)
    a.commit(3)
    b = KVCache.allocate(num_layers=1, capacity=4)
    kb, vb = states(1, 1, seed=2)
    b.write(0, kb, vb)
    b.commit(1)
    both = KVCache.concatenate([a, b], length=3, capacity=6)
    assert both.keys[0].shape[:2] == (3, 3) and both.keys[0].shape[2] >= 6  # room to spare for newcomers
    assert both.length == 3 and both.num_positions == 3
    assert torch.equal(both.keys[0][:2, :, :3], ka) and torch.equal(both.values[0][2:, :, 2:3], vb)
    assert not both.keys[0][2:, :, :2].any()


def test_select_in_swap_remove_order_moves_only_the_rows_that_fill_gaps():
    """Dropping rows 1 and 2 of 5 moves rows 4 and 3 into their places, in the same buffers; the
    live positions start after the ones no kept row needs."""
    cache = KVCache.allocate(num_layers=2, capacity=6)
    keys, values = states(5, 4, seed=3)
    for layer in range(2):
        cache.write(layer, keys, values)
    cache.commit(4)
    buffer = cache.keys[1].data_ptr()
    order = swap_remove_order(5, [0, 3, 4])
    assert order == [0, 4, 3]
    kept = cache.select(order, length=3)
    assert kept.keys[1].data_ptr() == buffer and kept.num_rows == 3 and kept.num_positions == 3
    live_keys, live_values = kept.write(1, *states(3, 1, seed=4))
    assert torch.equal(live_keys[:, :, :3], keys[order][:, :, 1:])
    assert torch.equal(live_values[:, :, :3], values[order][:, :, 1:])


def test_select_in_another_order_copies_into_new_buffers():
    """An order whose moves would overwrite a row still to be read is gathered into new buffers."""
    cache = KVCache.allocate(num_layers=1, capacity=4)
    keys, values = states(3, 2, seed=5)
    cache.write(0, keys, values)
    cache.commit(2)
    kept = cache.select([2, 0], length=2)
    assert torch.equal(kept.keys[0][:, :, :2], keys[[2, 0]]) and torch.equal(kept.values[0][:, :, :2], values[[2, 0]])


def test_a_filtered_cache_takes_newcomers_into_its_freed_rows_in_place():
    """After a filter freed rows, concatenate writes the newcomers there (same buffers): shorter
    ones right-aligned after zeros, and a longer one extends every row's live positions leftwards."""
    running = KVCache.allocate(num_layers=1, capacity=10)
    keys, values = states(3, 4, seed=6)
    running.write(0, keys, values)
    running.commit(4)
    running = running.select(swap_remove_order(3, [0, 1]), length=3)  # live: positions 1..3
    buffer = running.key_buffers[0].data_ptr()
    newcomer = KVCache.allocate(num_layers=1, capacity=4)
    new_keys, new_values = states(1, 2, seed=7)
    newcomer.write(0, new_keys, new_values)
    newcomer.commit(2)
    merged = KVCache.concatenate([running, newcomer], length=3, capacity=6)
    assert merged.key_buffers[0].data_ptr() == buffer and merged.num_rows == 3 and merged.num_positions == 3
    assert torch.equal(merged.keys[0][:2, :, 1:4], keys[:2, :, 1:])
    assert torch.equal(merged.values[0][2, :, 2:4], new_values[0]) and not merged.keys[0][2, :, 1].any()
    longer = KVCache.allocate(num_layers=1, capacity=4)
    long_keys, long_values = states(1, 4, seed=8)
    longer.write(0, long_keys, long_values)
    longer.commit(4)
    dropped = merged.select([0, 1], length=3)
    extended = KVCache.concatenate([dropped, longer], length=4, capacity=6)
    assert extended.key_buffers[0].data_ptr() == buffer and extended.num_positions == 4
    assert not extended.keys[0][:2, :, 0].any() and torch.equal(extended.keys[0][2, :, 0:4], long_keys[0])


def test_swap_remove_order():
    """Kept rows stay put; each gap is filled from the end; nothing moves when the tail is dropped."""
    assert swap_remove_order(4, [0, 1]) == [0, 1]
    assert swap_remove_order(4, [1, 2, 3]) == [3, 1, 2]
    assert swap_remove_order(6, [5, 0, 2]) == [0, 5, 2]


def test_decode_steps_write_in_place_and_equal_a_dynamic_cache(tiny_model_each_backend, tiny_reference):
    """Decode steps reuse the batch's buffers (no copy) and give the logits a DynamicCache gives,
    through either forward."""
    tiny_model = tiny_model_each_backend
    batch = batch_of(tiny_model, [request(1, [1, 504, 3458, 282], 6, ignore_eos=True),
                                  request(2, [1, 9690], 6, ignore_eos=True)])
    _, batch, _ = tiny_model.generate_token(batch)
    buffer = batch.kv_cache.keys[0].data_ptr()
    reference = DynamicCache()
    with torch.inference_mode():
        width = batch.max_input_length
        tiny_reference(input_ids=batch.token_ids[:, :width - 1], attention_mask=batch.attention_mask[:, :width - 1],
                       position_ids=(batch.attention_mask[:, :width - 1].cumsum(-1) - 1).clamp_min(0),
                       past_key_values=reference, use_cache=True)
        for _ in range(3):
            expected = tiny_reference(input_ids=batch.input_ids, attention_mask=batch.forward_attention_mask,
                                      position_ids=batch.position_ids, past_key_values=reference,
                                      use_cache=True).logits[:, -1]
            logits, _ = tiny_model.forward(batch)
            torch.testing.assert_close(logits[:, -1], expected)
            batch.kv_cache.commit(-1)  # forward committed the step: undo, generate_token redoes it below
            _, batch, _ = tiny_model.generate_token(batch)
            assert batch.kv_cache.keys[0].data_ptr() == buffer
