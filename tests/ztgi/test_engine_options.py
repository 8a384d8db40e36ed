"""vLLM's `tensor_parallel_size` on the offline engine: 1 is accepted; more is refused before any model loads."""

from __future__ import annotations

import pytest

from ztgi.engine_options import EngineOptions


def test_one_rank_is_accepted() -> None:
    assert EngineOptions.parse({"tensor_parallel_size": 1, "max_batch_size": 4}).scheduler == {"max_batch_size": 4}


def test_more_ranks_point_to_the_server_group() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2: .* `ztgi launch --num-shard N`"):
        EngineOptions.parse({"tensor_parallel_size": 2})
