"""Loading a vision-language model: its text part for the native forward, its encoder beside it, and refusals."""

from __future__ import annotations

import dataclasses

import pytest

from tests.worker.engine_helpers import batch_of, request, run_to_end
from tests.worker.vision.image_prompts import image_prompt, pictures
from ztgi.services.worker.model_loader import load_model


def test_the_worker_says_it_takes_images(vision_model, family):
    """WorkerInfo.vision is set; the text config is the language model's."""
    info = vision_model.info()
    assert info.vision and info.hidden_size == 64
    assert vision_model.loaded.vision is not None and vision_model.loaded.vision.uses_mrope == (family != "idefics3")


def test_the_padded_engine_and_other_quantizations_refuse_images(vision_dirs):
    """--kv-cache padded, --quantize gguf, and int8 of a text part other than Llama's are refused
    with the reason."""
    directory = vision_dirs["qwen2_vl"]
    with pytest.raises(ValueError, match="vision-language model.*--kv-cache paged"):
        load_model(directory, dtype="float32", device="cpu", kv_cache="padded")
    with pytest.raises(ValueError, match="not from a GGUF file's blocks"):
        load_model(directory, dtype="float32", device="cpu", quantize="gguf")
    with pytest.raises(ValueError, match="--quantize int8 is served for Llama models only"):
        load_model(directory, dtype="float32", device="cpu", quantize="int8")


def test_int8_text_of_idefics3_takes_images(vision_dirs):
    """Idefics3's Llama text part in int8 (the encoder in float) answers an image prompt."""
    directory = vision_dirs["idefics3"]
    model = load_model(directory, dtype="float32", device="cpu", kv_cache="paged", block_size=4, quantize="int8")
    model.allocate_pool(64)
    prompt = image_prompt("idefics3", directory, pictures(1))
    sent = dataclasses.replace(request(1, prompt.input_ids, 4, ignore_eos=True), images=prompt.images)
    generations = run_to_end(model, batch_of(model, [sent]))[1]
    assert len(generations) == 4 and generations[-1].finish_reason == "length"
