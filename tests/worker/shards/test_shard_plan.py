"""Which ranges each rank holds, and the sizes a model refuses with the counts it takes."""

from __future__ import annotations

import types

import pytest

from ztgi.services.worker.shards.shard_plan import ShardPlan, check_num_shard


def config(heads: int = 9, kv_heads: int = 3, intermediate: int = 1536, vocab: int = 49152) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=heads * 64,
                                 intermediate_size=intermediate, vocab_size=vocab)


def test_smollm2_in_three_ranks_holds_three_query_heads_and_one_kv_head_each() -> None:
    plans = [ShardPlan.for_rank(config(), rank, 3) for rank in range(3)]
    assert [(p.query_rows.start, p.query_rows.stop) for p in plans] == [(0, 192), (192, 384), (384, 576)]
    assert [(p.kv_rows.start, p.kv_rows.stop) for p in plans] == [(0, 64), (64, 128), (128, 192)]
    assert [(p.intermediate.start, p.intermediate.stop) for p in plans] == [(0, 512), (512, 1024), (1024, 1536)]
    assert [(p.vocab.start, p.vocab.stop) for p in plans] == [(0, 16384), (16384, 32768), (32768, 49152)]


def test_kv_heads_fewer_than_ranks_are_replicated_to_the_ranks_that_read_them() -> None:
    """8 query heads over 2 KV heads in 4 ranks: ranks 0-1 hold KV head 0 (read by query heads
    0-3), ranks 2-3 KV head 1."""
    plans = [ShardPlan.for_rank(config(heads=8, kv_heads=2, intermediate=64), rank, 4) for rank in range(4)]
    assert [p.first_kv_head for p in plans] == [0, 0, 1, 1]
    assert [p.num_kv_heads for p in plans] == [1, 1, 1, 1]
    assert [p.first_head for p in plans] == [0, 2, 4, 6]


def test_a_vocabulary_that_does_not_divide_leaves_the_last_rank_short() -> None:
    plans = [ShardPlan.for_rank(config(heads=4, kv_heads=2, intermediate=64, vocab=10), rank, 4) for rank in range(4)]
    assert [p.vocab_per_rank for p in plans] == [3] * 4
    assert [(p.vocab.start, p.vocab.stop) for p in plans] == [(0, 3), (3, 6), (6, 9), (9, 10)]


@pytest.mark.parametrize("num_shard", [2, 4, 6])
def test_a_split_the_heads_do_not_allow_is_refused_naming_those_that_work(num_shard: int) -> None:
    with pytest.raises(ValueError, match=r"--num-shard \d+ does not split this model \(9 query heads, 3 KV heads, "
                                         r"intermediate size 1536\): it splits into 1, 3$"):
        check_num_shard(config(), num_shard)


@pytest.mark.parametrize("num_shard", [0, -1])
def test_no_ranks_is_refused(num_shard: int) -> None:
    with pytest.raises(ValueError, match="--num-shard must be >= 1"):
        check_num_shard(config(), num_shard)
