"""Images in requests: the files clients send, and what the tokenizer makes of them for the worker."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import record

__all__ = ["ContentPart", "RawTensor", "EncodedImage"]


@record
class ContentPart:
    """One piece of a chat turn, in order: text, or an image (the file's bytes as the client sent
    them, after the gateway decoded the data URL or fetched the URL; PNG, JPEG, WebP or GIF)."""

    type: Literal["text", "image"]
    text: str = ""
    image: bytes = b""


@record
class RawTensor:
    """A tensor as bytes, never as a list: `dtype` a torch dtype's name (float32, int64, bool),
    `shape`, and `data` in C order, little-endian."""

    name: str
    dtype: str
    shape: list[int]
    data: bytes


@record
class EncodedImage:
    """One image as the model's vision encoder takes it, and where its embeddings go.

    `tensors` are the family's image processor's outputs for this image alone (`pixel_values`, and
    Idefics3's `pixel_attention_mask` or Qwen2-VL's `image_grid_thw`). The prompt holds the image's
    `num_tokens` placeholder tokens (the config's `image_token_id`) inside `[start, end)`, in order:
    the encoder's output rows replace their embeddings; other tokens inside the span (Idefics3's
    tile markers) are text. `digest` is a hash of the tensors: the prefix cache keys the blocks
    that cover the span with it, so two images never share keys and values and the same image sent
    again is a hit.
    """

    digest: bytes
    start: int
    end: int
    num_tokens: int
    tensors: list[RawTensor]
