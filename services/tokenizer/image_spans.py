"""Where each image sits in the prompt's ids: its span of placeholder tokens, found after
tokenizing, and kept or dropped when `truncate` cuts the prompt's start."""

from __future__ import annotations

import dataclasses

from ztgi.common.messages import EncodedImage
from ztgi.common.parameters import ValidationError
from ztgi.services.tokenizer.vision_processor import ProcessedImage


def locate_images(input_ids: list[int], images: list[ProcessedImage], image_token_id: int) -> list[EncodedImage]:
    """Each image with `[start, end)` from its first placeholder id to one past its last: the
    prompt's placeholders, in order, are the images' `num_tokens` one image after the other. A
    prompt whose placeholders are not exactly its images' (text or ids that spell the image token
    themselves) is refused: the worker would have no pixels for them."""
    positions = [index for index, token_id in enumerate(input_ids) if token_id == image_token_id]
    expected = sum(image.num_tokens for image in images)
    if len(positions) != expected:
        raise ValidationError("inputs", f"the prompt holds {len(positions)} image tokens (id {image_token_id}) where "
                                        f"its {len(images)} images take {expected}: the image token may only come "
                                        f"from an image")
    located, first = [], 0
    for image in images:
        last = first + image.num_tokens - 1
        located.append(EncodedImage(image.digest, positions[first], positions[last] + 1, image.num_tokens,
                                    image.tensors))
        first = last + 1
    return located


def truncate_images(images: list[EncodedImage], num_cut: int, truncate: int) -> list[EncodedImage]:
    """The images left when the prompt's first `num_cut` ids are cut (`truncate` keeps the rest):
    an image cut away entirely is dropped, the others move back; a cut through an image is refused,
    since half an image's rows would not match its pixels."""
    kept = []
    for number, image in enumerate(images, start=1):
        if image.end <= num_cut:
            continue
        if image.start < num_cut:
            raise ValidationError("truncate", f"`truncate` {truncate} cuts through image {number} (its tokens "
                                              f"{image.start}..{image.end - 1} of {num_cut + truncate}): keep more "
                                              f"or fewer tokens")
        kept.append(dataclasses.replace(image, start=image.start - num_cut, end=image.end - num_cut))
    return kept
