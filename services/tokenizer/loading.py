"""Loading a model's tokenizer and, for a vision-language model, its image processor (never its weights)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ztgi.common.model_source import resolve_model
from ztgi.common.request_limit import MAX_IMAGE_PIXELS
from ztgi.services.tokenizer.vision_processor import (
    Idefics3VisionProcessor,
    Qwen2VLVisionProcessor,
    VisionProcessor,
)

logger = logging.getLogger(__name__)

IDEFICS3_TYPES = ("idefics3", "smolvlm")
QWEN2_VL_TYPES = ("qwen2_vl", "qwen2_5_vl")  # one image processor and placeholder expansion
VISION_TYPES = (*IDEFICS3_TYPES, *QWEN2_VL_TYPES)


def load_tokenizer(model_id: str) -> PreTrainedTokenizerBase:
    """The fast tokenizer of `model_id` (resolved like the worker's model); raises
    ModelNotFoundError when the id names nothing loadable here."""
    source = resolve_model(model_id)
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    if not tokenizer.is_fast:
        logger.warning("%s has no fast tokenizer: encoding and decoding will be slow", source.name)
    logger.info("tokenizer of %s loaded (vocabulary %d)", source.name, len(tokenizer))
    return tokenizer


def load_vision_processor(model_id: str, tokenizer: PreTrainedTokenizerBase,
                          max_image_pixels: int = MAX_IMAGE_PIXELS.default) -> VisionProcessor | None:
    """The image side of a vision-language model (Idefics3, SmolVLM, Qwen2-VL, Qwen2.5-VL), with its PIL image
    processor (torchvision is not needed); None for a text model, whose requests with images are
    refused. A vision model of another family is served as text, with a warning. Gives `tokenizer`
    the processor's chat template where the tokenizer has none (older Idefics3 checkpoints)."""
    source = resolve_model(model_id)
    config = _read_json(source.path, "config.json")
    model_type = config.get("model_type")
    if model_type not in VISION_TYPES:
        if "vision_config" in config:
            logger.warning("%s is a %s vision-language model: images are supported for %s only, so its requests "
                           "with images are refused", source.name, model_type, ", ".join(VISION_TYPES))
        return None
    # imported here: transformers' image processors pull in torch and its model utilities, seconds
    # of every tokenizer's start that a text model never uses
    from transformers import AutoImageProcessor

    image_processor = AutoImageProcessor.from_pretrained(source.path, backend="pil")
    _adopt_chat_template(tokenizer, source.path)
    logger.info("images of %s through %s", source.name, type(image_processor).__name__)
    if model_type in IDEFICS3_TYPES:
        image_token_id = _image_token_id(config, tokenizer, Idefics3VisionProcessor.placeholder)
        image_seq_len = _image_seq_len(source.path, config)
        return Idefics3VisionProcessor(image_processor, image_token_id, max_image_pixels, image_seq_len)
    image_token_id = _image_token_id(config, tokenizer, Qwen2VLVisionProcessor.placeholder)
    return Qwen2VLVisionProcessor(image_processor, image_token_id, max_image_pixels)


def _image_token_id(config: dict[str, Any], tokenizer: PreTrainedTokenizerBase, placeholder: str) -> int:
    """The config's `image_token_id` (what the worker replaces), else the placeholder's id."""
    token_id = config.get("image_token_id")
    if token_id is None:
        token_id = tokenizer.convert_tokens_to_ids(placeholder)
        assert isinstance(token_id, int), "one token converts to one id"
    return int(token_id)


def _image_seq_len(path: str, config: dict[str, Any]) -> int:
    """Idefics3's `<image>` tokens per tile: the processor's setting, else what the config implies
    (the vision encoder's patches per tile after the pixel shuffle)."""
    saved = _read_json(path, "processor_config.json").get("image_seq_len")
    if saved is not None:
        return int(saved)
    vision = config["vision_config"]
    return int((vision["image_size"] // vision["patch_size"]) ** 2 / config.get("scale_factor", 2) ** 2)


def _adopt_chat_template(tokenizer: PreTrainedTokenizerBase, path: str) -> None:
    if tokenizer.chat_template:
        return
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as file:
            tokenizer.chat_template = file.read()
    else:
        tokenizer.chat_template = _read_json(path, "chat_template.json").get("chat_template")


def _read_json(path: str, name: str) -> dict[str, Any]:
    """A JSON file of the model directory, or {} where there is none."""
    try:
        with open(os.path.join(path, name), encoding="utf-8") as file:
            value: dict[str, Any] = json.load(file)
    except FileNotFoundError:
        return {}
    return value
