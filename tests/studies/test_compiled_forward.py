"""The compiled-forward benchmark times the worker's step: its compiled variant computes the same logits."""

from __future__ import annotations

import pytest
import torch

from studies.compiled_forward import call_forward, step_shapes, variant_forward
from ztgi.services.worker.model_loader import load_model


@pytest.mark.slow
def test_compiled_dense_parts_compute_the_eager_step(tiny_model_dir: str) -> None:
    """float32 decode and prefill steps through torch.compile'd dense parts (packed linears) agree
    with the worker's eager forward to rounding, with the same greedy token in every row."""
    model = load_model(tiny_model_dir, "float32", "cpu", kv_cache="paged")
    model.allocate_pool(16)
    with torch.inference_mode():
        shapes = step_shapes(model, [1, 3], prefill_tokens=20, context=10)
        eager, compiled = variant_forward(model, "eager"), variant_forward(model, "compiled")
        for inputs in shapes.values():
            expected, got = call_forward(eager, inputs, model.pool), call_forward(compiled, inputs, model.pool)
            assert got.shape == expected.shape == (len(inputs.logit_rows), model.vocab_size)
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), expected.argmax(-1))
