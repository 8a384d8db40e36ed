"""A bad image ends its own request with an error generation; the batch's other requests go on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.worker.engine_helpers import batch_of, request, run_to_end, token_ids
from tests.worker.vision.image_prompts import image_prompt, pictures, reference_ids
from ztgi.common.messages.images import RawTensor


def _spoiled(image, how: str):
    pixels = next(t for t in image.tensors if t.name == "pixel_values")
    others = [t for t in image.tensors if t.name != "pixel_values"]
    match how:
        case "dtype":
            pixels = RawTensor(pixels.name, "int64", [len(pixels.data) // 8], pixels.data)
        case "bytes":
            pixels = dataclasses.replace(pixels, data=pixels.data[:-4])
        case "count":
            return dataclasses.replace(image, num_tokens=image.num_tokens + 1)
    return dataclasses.replace(image, tensors=[pixels, *others])


@pytest.mark.parametrize("how, message", [("dtype", "`pixel_values` must be float32"), ("bytes", "needs"),
                                          ("count", "image tokens")])
def test_a_bad_image_fails_its_request_only(family, family_dir, vision_model, vision_reference, how, message):
    """A wrong dtype, a short buffer or a wrong token count: that request's one generation is an
    error naming it; a good request in the same batch gets `generate`'s tokens."""
    prompt = image_prompt(family, family_dir, pictures(1))
    good = dataclasses.replace(request(1, prompt.input_ids, 6, ignore_eos=True), images=prompt.images)
    bad = dataclasses.replace(good, seq_id=2, images=[_spoiled(prompt.images[0], how)])
    got = run_to_end(vision_model, batch_of(vision_model, [good, bad]))
    [failure] = got[2]
    assert failure.finish_reason == "error" and "request 2" in failure.error and message in failure.error
    assert token_ids(got)[1] == reference_ids(vision_reference, prompt, 6)


def test_images_sent_to_a_text_model_fail_the_request(tiny_paged_model, family, family_dir):
    """A text-only model answers a request with images with an error, not a crash."""
    prompt = image_prompt(family, family_dir, pictures(1))
    ids = [min(token, tiny_paged_model.vocab_size - 1) for token in prompt.input_ids]
    sent = dataclasses.replace(request(3, ids, 2), images=prompt.images)
    [failure] = run_to_end(tiny_paged_model, batch_of(tiny_paged_model, [sent]))[3]
    assert failure.finish_reason == "error" and "does not take images" in failure.error


def test_images_sent_to_a_padded_worker_are_refused(tiny_model, vision_dirs):
    """The padded engine serves no vision-language model: a request with images is a ValueError naming it."""
    from tests.worker.vision.image_prompts import encoded_image

    image = encoded_image({"pixel_values": torch.zeros(1, 4)}, 0, 1, 1)
    with pytest.raises(ValueError, match="request 4: .*takes no images"):
        batch_of(tiny_model, [dataclasses.replace(request(4, [1, 2, 3], 2), images=[image])])


def test_an_encoder_failure_fails_its_request_only(family, family_dir, vision_model, monkeypatch):
    """The encoder raising (here on its second image) ends that request with the exception's words;
    the worker's model steps on and the other request finishes."""
    prompt = image_prompt(family, family_dir, pictures(1))
    encoder = vision_model.loaded.vision
    calls = []
    original = encoder.multimodal.get_image_features

    def breaking(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of pixels")
        return original(*args, **kwargs)

    monkeypatch.setattr(encoder.multimodal, "get_image_features", breaking)
    good = dataclasses.replace(request(1, prompt.input_ids, 3, ignore_eos=True), images=prompt.images)
    got = run_to_end(vision_model, batch_of(vision_model, [good, dataclasses.replace(good, seq_id=2)]))
    assert [g.finish_reason for g in got[1]] == [None, None, "length"]
    [failure] = got[2]
    assert "the vision encoder failed" in failure.error and "RuntimeError: out of pixels" in failure.error
