"""KVCache: preallocated per-layer buffers written in place, grown on demand, copied only on filter/concatenate."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from services.worker.kv_cache import KVCache
from tests.worker.engine_helpers import batch_of, request


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


def test_select_and_concatenate_keep_rows_right_aligned():
    """select keeps the rows' last positions; concatenate right-aligns each cache and zero-pads before."""
    a = KVCache.allocate(num_layers=1, capacity=4)
    ka, va = states(2, 3, seed=1)
    a.write(0, ka, va)
    a.commit(3)
    b = KVCache.allocate(num_layers=1, capacity=4)
    kb, vb = states(1, 1, seed=2)
    b.write(0, kb, vb)
    b.commit(1)
    kept = a.select(torch.tensor([1]), length=2, capacity=5)
    assert kept.capacity == 5 and torch.equal(kept.keys[0][:, :, :2], ka[1:, :, 1:])
    both = KVCache.concatenate([a, b], length=3, capacity=6)
    assert both.keys[0].shape == (3, 3, 6, 4) and both.length == 3
    assert torch.equal(both.keys[0][:2, :, :3], ka) and torch.equal(both.values[0][2:, :, 2:3], vb)
    assert not both.keys[0][2:, :, :2].any()


def test_decode_steps_write_in_place_and_equal_a_dynamic_cache(tiny_model_each_backend, tiny_reference):
    """Decode steps reuse the batch's buffers (no copy) and give the logits a DynamicCache gives,
    through either forward."""
    tiny_model = tiny_model_each_backend
    batch = batch_of(tiny_model, [request(1, [1, 504, 3458, 282], 6, ignore_eos=True),
                                  request(2, [1, 9690], 6, ignore_eos=True)])
    _, batch, _ = tiny_model.generate_token(batch)
    buffer = batch.past.keys[0].data_ptr()
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
            batch.past.commit(-1)  # forward committed the step: undo, generate_token redoes it below
            _, batch, _ = tiny_model.generate_token(batch)
            assert batch.past.keys[0].data_ptr() == buffer
