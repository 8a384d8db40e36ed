"""Loading a vision-language model: its text part for the native forward, its encoder beside it, and refusals."""

from __future__ import annotations

import pytest

from ztgi.services.worker.model_loader import load_model


def test_the_worker_says_it_takes_images(vision_model, family):
    """WorkerInfo.vision is set; the text config is the language model's."""
    info = vision_model.info()
    assert info.vision and info.hidden_size == 64
    assert vision_model.loaded.vision is not None and vision_model.loaded.vision.uses_mrope == (family == "qwen2_vl")


def test_the_padded_engine_and_quantization_refuse_images(vision_dirs):
    """--kv-cache padded and --quantize int8 are refused with the reason and what to use."""
    directory = vision_dirs["qwen2_vl"]
    with pytest.raises(ValueError, match="vision-language model.*--kv-cache paged"):
        load_model(directory, dtype="float32", device="cpu", kv_cache="padded")
    with pytest.raises(ValueError, match="--quantize int8 is not served for vision-language models"):
        load_model(directory, dtype="float32", device="cpu", quantize="int8")
