"""Tiny random-weight vision-language models for the tests: Idefics3 (SmolVLM's architecture, a
Llama text model) and Qwen2-VL (multimodal rotary positions), each saved as a directory with its
processor (PIL image processor, chat template) and SmolLM2's real tokenizer plus the family's image
tokens. Nothing is downloaded. The images are small (tens of pixels) so that a step stays fast."""

from __future__ import annotations

import io
import os

import torch
from PIL import Image

IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _tokenizer(smollm2_dir: str, tokens: list[str]):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_extra_special_tokens=False)
    return tokenizer


def _vocab_size(tokenizer) -> int:  # type: ignore[no-untyped-def]
    return -(-len(tokenizer) // 64) * 64


def write_tiny_idefics3(directory: str, smollm2_dir: str, seed: int = 0) -> str:
    """Idefics3 with a 2-layer SigLIP encoder on 32-pixel tiles of 8-pixel patches (4 tokens a tile
    after the pixel shuffle) and a 2-layer Llama; images up to 64 pixels a side are cut into up to 2x2
    tiles plus the whole image."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    rows = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer = _tokenizer(smollm2_dir, ["<fake_token_around_image>", "<image>", "<global-img>",
                                         "<end_of_utterance>", *rows])
    config = Idefics3Config(
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2, tie_word_embeddings=False,
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        text_config={"model_type": "llama", "vocab_size": _vocab_size(tokenizer), "hidden_size": 64,
                     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "max_position_embeddings": 2048, "bos_token_id": 1,
                     "eos_token_id": 2, "pad_token_id": 2, "tie_word_embeddings": False})
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).save_pretrained(directory)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                                do_image_splitting=True)
    Idefics3Processor(image_processor, tokenizer, image_seq_len=4,
                      chat_template=IDEFICS3_TEMPLATE).save_pretrained(directory)
    return directory


QWEN2_VL_VISION = {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2}
QWEN2_5_VL_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                     "window_size": 16, "fullatt_block_indexes": [1]}


def write_tiny_qwen2_vl(directory: str, smollm2_dir: str, seed: int = 0, version: str = "2") -> str:
    """Qwen2-VL (`version` "2") or Qwen2.5-VL ("2.5": RMSNorm, gated MLP, windowed attention in all
    vision blocks but the last) with a 2-layer vision transformer on 4-pixel patches merged 2x2 and a
    2-layer Qwen2 (multimodal rotary sections 2+3+3 of a 16-wide head); images between 8x8 and
    32x32 pixels after resizing."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    config_class, model_class, vision = ((Qwen2VLConfig, Qwen2VLForConditionalGeneration, QWEN2_VL_VISION)
                                         if version == "2" else
                                         (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, QWEN2_5_VL_VISION))
    tokenizer = _tokenizer(smollm2_dir, ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
                                         "<|im_end|>"])
    ids = tokenizer.convert_tokens_to_ids
    config = config_class(
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        text_config={"vocab_size": _vocab_size(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                         "mrope_section": [2, 3, 3]}},
        vision_config={**vision, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2})
    torch.manual_seed(seed)
    model_class(config).save_pretrained(directory)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=8 * 8, max_pixels=32 * 32, patch_size=4, merge_size=2,
                                               temporal_patch_size=2)
    image_processor.save_pretrained(directory)  # Qwen2VLProcessor insists on a torchvision video processor
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def write_tiny_qwen2_5_vl(directory: str, smollm2_dir: str, seed: int = 0) -> str:
    return write_tiny_qwen2_vl(directory, smollm2_dir, seed, version="2.5")


def drawn_image(width: int, height: int, seed: int, image_format: str = "PNG") -> bytes:
    """A picture of random coloured rectangles on a random background, encoded as `image_format`:
    what a client sends."""
    generator = torch.Generator().manual_seed(seed)

    def colour() -> tuple[int, int, int]:
        red, green, blue = (int(v) for v in torch.randint(0, 256, (3,), generator=generator))
        return red, green, blue

    image = Image.new("RGB", (width, height), colour())
    for _ in range(4):
        left = int(torch.randint(0, width, (1,), generator=generator))
        top = int(torch.randint(0, height, (1,), generator=generator))
        image.paste(colour(), (left, top, min(width, left + width // 2 + 1), min(height, top + height // 2 + 1)))
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def vision_model_dirs(root: str, smollm2_dir: str) -> dict[str, str]:
    """Both tiny models under `root`, written once."""
    writers = {"idefics3": write_tiny_idefics3, "qwen2_vl": write_tiny_qwen2_vl, "qwen2_5_vl": write_tiny_qwen2_5_vl}
    dirs = {family: os.path.join(root, family) for family in writers}
    for family, write in writers.items():
        if not os.path.isfile(os.path.join(dirs[family], "tokenizer_config.json")):
            write(dirs[family], smollm2_dir)
    return dirs


IMAGE_STRINGS = {"idefics3": "<image>", "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
                 "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>"}
"""What stands for one image in a family's prompt text before its processor expands it."""


def reference_inputs(family: str, directory: str, text: str, images: list[bytes]) -> dict[str, torch.Tensor]:
    """transformers' model inputs for a prompt `text` holding one IMAGE_STRINGS[family] per image:
    Idefics3Processor's output, or for Qwen2-VL its image processor's with each `<|image_pad|>`
    repeated as Qwen2VLProcessor documents (grid_t * grid_h * grid_w / merge_size**2 times) and its
    `mm_token_type_ids` (1 at image tokens)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    if family == "idefics3":
        processor = AutoProcessor.from_pretrained(directory)
        return dict(processor(text=text, images=pictures or None, return_tensors="pt"))
    image_processor = AutoImageProcessor.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tensors = dict(image_processor(images=pictures, return_tensors="pt")) if pictures else {}
    pieces = text.split("<|image_pad|>")
    expanded = pieces[0]
    for grid, piece in zip(tensors.get("image_grid_thw", []), pieces[1:]):
        expanded += "<|image_pad|>" * (int(grid.prod()) // image_processor.merge_size ** 2) + piece
    inputs = {**dict(tokenizer(expanded, return_tensors="pt")), **tensors}
    # what Qwen2VLProcessor adds: without it transformers falls back to one-dimensional positions
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int()
    return inputs


def chat_text(directory: str, conversation: list[dict]) -> str:  # type: ignore[type-arg]
    """The family's chat template over a conversation whose content lists `{"type": "image"}` and
    `{"type": "text", "text": ...}` parts, with the assistant's turn to come."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    template = tokenizer.chat_template
    if template is None:
        with open(os.path.join(directory, "chat_template.jinja")) as file:
            template = file.read()
    text = tokenizer.apply_chat_template(conversation, chat_template=template, add_generation_prompt=True,
                                         tokenize=False)
    assert isinstance(text, str)
    return text


def greedy_reference(directory: str, inputs: dict[str, torch.Tensor], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation (float32) of `inputs`: the ids after the prompt."""
    return greedy_logprobs(directory, inputs, max_new_tokens)[0]


def greedy_logprobs(directory: str, inputs: dict[str, torch.Tensor],
                    max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation (float32) of `inputs` and each chosen token's logprob: the
    random models' distributions are nearly flat, so a test that only compares ids could miss a
    small error that a logprob shows."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32).eval()
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, output_scores=True,
                            return_dict_in_generate=True)
    ids = output.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    logprobs = [float(torch.log_softmax(scores[0].float(), -1)[token]) for scores, token in zip(output.scores, ids)]
    return ids, logprobs
