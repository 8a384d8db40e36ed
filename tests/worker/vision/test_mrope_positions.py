"""Qwen2-VL's multimodal positions equal transformers' `get_rope_index`, and past the prompt go on at t + delta."""

from __future__ import annotations

import torch

from tests.worker.vision.image_prompts import image_prompt, pictures
from ztgi.services.worker.vision.prompt_images import PromptImages


def test_positions_equal_get_rope_index(vision_dirs):
    """Two images of different grids between text: the table and the delta are transformers'."""
    from transformers import AutoModelForImageTextToText

    from ztgi.services.worker.models.loading import load

    directory = vision_dirs["qwen2_vl"]
    prompt = image_prompt("qwen2_vl", directory, pictures(3)[1:])
    loaded = load(directory, dtype="float32", device="cpu")
    assert loaded.vision is not None
    images = PromptImages(prompt.images)
    images.locate(prompt.input_ids, loaded.vision)
    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32)
    inputs = prompt.inputs
    expected, delta = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                 image_grid_thw=inputs["image_grid_thw"])
    assert images.rope is not None
    assert torch.equal(images.rope.table, expected[:, 0]) and images.rope.delta == int(delta) != 0
    length = len(prompt.input_ids)
    assert images.rope.positions(length - 2, 4) == [
        expected[axis, 0, -2:].tolist() + [length + int(delta), length + 1 + int(delta)] for axis in range(3)]
