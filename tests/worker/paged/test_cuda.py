"""The paged engine on CUDA: greedy tokens equal transformers' in float32 and bfloat16.

Marked `cuda`: skipped where torch sees no CUDA device (CI, the CPU development machines).
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.services.worker.model_loader import load_model

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = {1: list(range(3, 40)), 2: [5, 6, 7], 3: list(range(100, 160))}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paged_greedy_on_cuda_equals_transformers(tiny_model_dir, dtype):
    from transformers import AutoModelForCausalLM

    model = load_model(tiny_model_dir, dtype=dtype, device="cuda", kv_cache="paged", block_size=16)
    model.allocate_pool(256)
    assert model.device.type == "cuda" and model.pool.keys[0].is_cuda
    got = token_ids(run_to_end(model, batch_of(model, [request(rid, ids, 12)
                                                       for rid, ids in PROMPTS.items()])))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=getattr(torch, dtype)).cuda().eval()
    for rid, ids in PROMPTS.items():
        out = reference.generate(torch.tensor([ids], device="cuda"), max_new_tokens=12, do_sample=False,
                                 pad_token_id=2)
        assert got[rid] == out[0, len(ids):].tolist(), f"request {rid}"


def test_pool_is_sized_from_free_device_memory(tiny_model_dir):
    from ztgi.common.messages import Warmup
    from ztgi.services.worker.engine import Engine

    model = load_model(tiny_model_dir, dtype="bfloat16", device="cuda", kv_cache="paged")
    result = Engine(model, memory_budget_mb=1).warmup(Warmup(1, 256, 512, 1024, None))
    pool_bytes = result.num_blocks * model.kv_shape.bytes_per_block
    _, total = torch.cuda.mem_get_info()
    assert 2**20 < pool_bytes < total  # from device memory, not the 1 MB CPU budget
    assert model.pool.keys[0].is_cuda
