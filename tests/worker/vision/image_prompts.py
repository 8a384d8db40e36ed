"""Prompts with images for the worker's tests: the family's processor's inputs for transformers, and
the same prompt as a WorkerRequest's ids and EncodedImages (each image's tensors from the processor
for that image alone, its span over its placeholder tokens), as the tokenizer service sends them."""

from __future__ import annotations

import dataclasses
import hashlib
import io

import torch
from PIL import Image

from tests.vision_models import drawn_image
from ztgi.common.messages.images import EncodedImage, RawTensor

QUESTION = "What is this?"


@dataclasses.dataclass
class ImagePrompt:
    """One prompt: `inputs` for transformers' `generate`, `input_ids` and `images` for the worker."""

    inputs: dict[str, torch.Tensor]
    input_ids: list[int]
    images: list[EncodedImage]


def pictures(count: int) -> list[Image.Image]:
    """`count` small different pictures (sizes that make several tiles, or a few patches)."""
    sizes = [(50, 37), (20, 30), (33, 60)]
    return [Image.open(io.BytesIO(drawn_image(*sizes[i % 3], seed=i + 1))).convert("RGB") for i in range(count)]


def image_prompt(family: str, directory: str, images: list[Image.Image], text: str = QUESTION) -> ImagePrompt:
    """The chat prompt of a user turn with `images` then `text`, processed for `family`."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    if family == "idefics3":
        return _idefics3(directory, messages, images)
    return _qwen2_vl(directory, messages, images)


def _idefics3(directory: str, messages: list, images: list[Image.Image]) -> ImagePrompt:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(directory)
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = dict(processor(text=text, images=images or None, return_tensors="pt"))
    alone = [dict(processor.image_processor(images=[image], return_tensors="pt")) for image in images]
    counts = [int(t["pixel_values"].shape[1]) * processor.image_seq_len for t in alone]
    image_token_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    return _prompt(inputs, alone, counts, image_token_id)


def _qwen2_vl(directory: str, messages: list, images: list[Image.Image]) -> ImagePrompt:
    from transformers import AutoImageProcessor, AutoTokenizer

    image_processor, tokenizer = AutoImageProcessor.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    alone = [dict(image_processor(images=[image], return_tensors="pt")) for image in images]
    counts = [int(t["image_grid_thw"].prod()) // image_processor.merge_size ** 2 for t in alone]
    parts = text.split("<|image_pad|>")
    text = parts[0] + "".join("<|image_pad|>" * count + part for count, part in zip(counts, parts[1:]))
    inputs = dict(tokenizer(text, return_tensors="pt"))
    image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    if images:
        inputs["pixel_values"] = torch.cat([t["pixel_values"] for t in alone])
        inputs["image_grid_thw"] = torch.cat([t["image_grid_thw"] for t in alone])
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == image_token_id).int()  # what Qwen2VLProcessor gives
    return _prompt(inputs, alone, counts, image_token_id)


def _prompt(inputs: dict, alone: list[dict], counts: list[int], image_token_id: int) -> ImagePrompt:
    input_ids = inputs["input_ids"][0].tolist()
    placeholders = [p for p, token in enumerate(input_ids) if token == image_token_id]
    assert len(placeholders) == sum(counts)
    images, taken = [], 0
    for tensors, count in zip(alone, counts):
        mine = placeholders[taken:taken + count]
        taken += count
        images.append(encoded_image(tensors, mine[0], mine[-1] + 1, count))
    return ImagePrompt(inputs, input_ids, images)


def encoded_image(tensors: dict[str, torch.Tensor], start: int, end: int, num_tokens: int) -> EncodedImage:
    raws = [raw_tensor(name, tensor) for name, tensor in sorted(tensors.items())]
    digest = hashlib.sha256(b"".join(raw.data for raw in raws)).digest()
    return EncodedImage(digest, start, end, num_tokens, raws)


def raw_tensor(name: str, tensor: torch.Tensor) -> RawTensor:
    tensor = tensor.contiguous()
    return RawTensor(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape),
                     tensor.numpy().tobytes())


def reference_ids(model: torch.nn.Module, prompt: ImagePrompt, max_new_tokens: int) -> list[int]:
    """transformers' greedy ids for the prompt."""
    with torch.inference_mode():
        out = model.generate(**prompt.inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, prompt.inputs["input_ids"].shape[1]:].tolist()
