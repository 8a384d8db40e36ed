"""What `LLM.generate` and `LLM.chat` accept, checked and put in one shape before any work starts."""

from __future__ import annotations

import dataclasses
import io
import numbers
from collections.abc import Sequence
from typing import Any

import PIL.Image

from ztgi.common.messages import ChatMessage, ContentPart
from ztgi.common.parameters import ValidationError
from ztgi.sampling_params import SamplingParams
from ztgi.services.gateway.image_inputs import decode_data_url, is_data_url

MAX_OFFLINE_IMAGE_BYTES = 2**31  # the caller's own files: no server-side cap on a data URL's size offline


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: text, token ids, or a conversation (exactly one of them). A text prompt's
    `images` (vLLM's `multi_modal_data`) are the files of the model's image placeholders in it, in
    order; a conversation's are in its turns' parts."""

    text: str | None = None
    token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    images: list[bytes] = dataclasses.field(default_factory=list)


def as_prompts(prompts: Any) -> list[Prompt]:
    """One prompt or many: strings, token-id lists, or vLLM's dicts (`prompt` / `prompt_token_ids`).
    A flat list of ints is one prompt of token ids."""
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a string, token ids, or a list of them, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts must not be empty: give at least one prompt")
    return [_as_prompt(index, prompt) for index, prompt in enumerate(prompts)]


def as_conversations(messages: Any) -> list[Prompt]:
    """One conversation (a list of {role, content} dicts) or a list of them."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts, or a list of such lists")
    conversations = [messages] if isinstance(messages[0], dict) else messages
    return [Prompt(messages=_conversation(index, conversation)) for index, conversation in enumerate(conversations)]


def per_prompt(sampling_params: SamplingParams | Sequence[SamplingParams] | None,
               num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams for every prompt, or one each (vLLM's rule)."""
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else None
    if params is None or not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got {sampling_params!r}")
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts: give one, or one per prompt")
    return params


def _as_prompt(index: int, prompt: Any) -> Prompt:
    images: list[bytes] = []
    if isinstance(prompt, dict):
        images = _multi_modal_images(index, prompt.get("multi_modal_data"))
        if "prompt_token_ids" in prompt:
            if images:
                raise ValueError(f"prompt {index}: images need a text prompt (with the model's image placeholders), "
                                 f"not token ids")
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
    if isinstance(prompt, str):
        return Prompt(text=prompt, images=images)
    if _is_token_ids(prompt) and prompt:
        return Prompt(token_ids=[int(token_id) for token_id in prompt])
    raise ValueError(f"prompt {index} must be a non-empty string, a non-empty list of token ids, or a dict with "
                     f"'prompt' or 'prompt_token_ids'; got {prompt!r:.80}")


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value) and len(value) > 0


def _conversation(index: int, conversation: Any) -> list[ChatMessage]:
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise ValueError(f"conversation {index} must be a non-empty list of {{'role', 'content'}} dicts")
    return [_chat_message(index, message) for message in conversation]


def _chat_message(index: int, message: Any) -> ChatMessage:
    """`content` is a string or OpenAI's list of parts: text (joined, as the gateway flattens
    them) and images (`image_url` with a data: URL, or vLLM's `image_pil` / `image` with a PIL image),
    kept in order in the turn's `parts`."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"conversation {index}: each message must be a dict with a string 'role', got {message!r:.80}")
    content = message.get("content")
    parts = None
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = [_content_part(index, part) for part in content]
        content = "".join(part.text for part in parts if part.type == "text")
    if not isinstance(content, str):
        raise ValueError(f"conversation {index}: 'content' must be a string or a list of text and image parts, "
                         f"got {content!r:.80}")
    has_images = parts is not None and any(part.type == "image" for part in parts)
    return ChatMessage(message["role"], content, parts=parts if has_images else None)


def _content_part(index: int, part: dict[str, Any]) -> ContentPart:
    kind = part.get("type")
    if kind == "text":
        return ContentPart("text", text=str(part.get("text", "")))
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str) or not is_data_url(url):
            raise ValueError(f"conversation {index}: offline, an image_url must be a data: URL "
                             f"(data:image/png;base64,...), or give the image itself as an image_pil part")
        try:
            return ContentPart("image", image=decode_data_url(url, MAX_OFFLINE_IMAGE_BYTES, "image_url"))
        except ValidationError as exc:
            raise ValueError(f"conversation {index}: {exc}") from None
    if kind in ("image_pil", "image"):
        return ContentPart("image", image=_image_file(index, part.get(kind)))
    raise ValueError(f"conversation {index}: a content part must be text, image_url or image_pil, got {kind!r}")


def _multi_modal_images(index: int, data: Any) -> list[bytes]:
    """vLLM's `multi_modal_data`: {"image": an image or a list of them}, each a PIL image or a file's bytes."""
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) - {"image"}:
        raise ValueError(f"prompt {index}: multi_modal_data takes only 'image' (an image or a list of them), "
                         f"got {data!r:.80}")
    images = data.get("image")
    images = images if isinstance(images, (list, tuple)) else [images]
    return [_image_file(index, image) for image in images]


def _image_file(index: int, image: Any) -> bytes:
    """A PIL image as a PNG file (lossless: the processor sees the same pixels), or a file's bytes as given."""
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, PIL.Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()
    raise ValueError(f"prompt {index}: an image must be a PIL image or an image file's bytes, got "
                     f"{type(image).__name__}")
