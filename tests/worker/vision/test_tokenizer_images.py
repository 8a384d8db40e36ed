"""The tokenizer service's images (services/tokenizer) are what the worker takes: the same ids as the
processor's, and `generate`'s tokens."""

from __future__ import annotations

import dataclasses
import io

import pytest
from transformers import AutoTokenizer

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from tests.worker.vision.image_prompts import QUESTION, image_prompt, pictures, reference_ids
from ztgi.services.tokenizer.image_spans import locate_images
from ztgi.services.tokenizer.loading import VISION_TYPES, load_vision_processor


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_tokenizers_images_give_generates_tokens(family, family_dir, vision_model, vision_reference):
    """Two images through the tokenizer's processor, placeholders expanded and located: the ids are
    the processor's, and the worker's greedy ids equal `generate`'s (Idefics3's mask travels as bool)."""
    if family not in VISION_TYPES:
        pytest.skip(f"the tokenizer takes no {family} images yet")
    images = pictures(2)
    expected = image_prompt(family, family_dir, images)
    tokenizer = AutoTokenizer.from_pretrained(family_dir)
    vision = load_vision_processor(family_dir, tokenizer)
    assert vision is not None
    processed = vision.process([_png(image) for image in images])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    input_ids = tokenizer(vision.expand(text, processed))["input_ids"]
    assert input_ids == expected.input_ids
    encoded = locate_images(input_ids, processed, vision.image_token_id)
    sent = dataclasses.replace(request(1, input_ids, 8, ignore_eos=True), images=encoded)
    got = token_ids(run_to_end(vision_model, batch_of(vision_model, [sent])))[1]
    assert got == reference_ids(vision_reference, expected, 8)
