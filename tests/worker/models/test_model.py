"""Model loading: device and dtype resolution, what the model reports, other dtypes."""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from ztgi.common.model_source import ModelNotFoundError
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.models.loading import resolve_device, resolve_dtype


def test_auto_picks_cuda_when_present_and_the_rules_dtype_on_cpu():
    """`auto` device is cuda when available, else cpu; `auto` dtype on CPU is `dtype_choice`'s
    (float32 or bfloat16, tests/worker/models/test_dtype_choice.py), explicit ones stay."""
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", torch.device("cpu")) in (torch.float32, torch.bfloat16)
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error():
    """Asking for cuda where there is none fails with a message saying so."""
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")


def test_info_reports_the_model(tiny_model, tiny_model_dir):
    """WorkerInfo carries the model's name, dtype, device, EOS ids, vocabulary and positions."""
    info = tiny_model.info()
    assert (info.model_id, info.dtype, info.device) == (tiny_model_dir, "float32", "cpu")
    assert (info.eos_token_ids, info.vocab_size, info.max_position_embeddings) == ([2], 49152, 2048)


def test_bfloat16_model_generates(tiny_model_dir):
    """A bfloat16 model runs prefill and decode (sampling runs in float32 on its logits)."""
    model = load_model(tiny_model_dir, dtype="bfloat16", device="cpu", kv_cache="padded")
    assert model.info().dtype == "bfloat16" and model.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    got = token_ids(run_to_end(model, batch_of(model, [request(1, [1, 2, 3], 4, ignore_eos=True, top_n_tokens=2)])))
    assert len(got[1]) == 4


def test_unknown_model_is_model_not_found(tmp_path):
    """A model id naming nothing loadable raises ModelNotFoundError."""
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "nothing.gguf"))
