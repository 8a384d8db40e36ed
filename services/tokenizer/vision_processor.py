"""A vision-language model's images at the edge: each file decoded, run through the family's own
transformers image processor alone, and the text its placeholder becomes in the prompt.

The prompt first holds one `image_string` per image (what the family's chat template writes, and
what a TGI markdown image is replaced with); `expand` then replaces each image's `placeholder` with
the tokens its processor asks for, exactly as the family's transformers processor does:

- Idefics3 (SmolVLM): `<image>` becomes, for an image cut into rows x cols tiles, one
  `<fake_token_around_image><row_r_col_c>` + `image_seq_len` x `<image>` per tile (a newline after
  each row), then a newline and the global image `<fake_token_around_image><global-img>` +
  `image_seq_len` x `<image>` + `<fake_token_around_image>` (`Idefics3Processor.replace_image_token`).
- Qwen2-VL: `<|image_pad|>` becomes grid_t * grid_h * grid_w // merge_size**2 copies of itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from PIL import Image

from ztgi.common.codec import MAX_IMAGE_BYTES_PER_MESSAGE
from ztgi.common.messages import RawTensor
from ztgi.common.parameters import ValidationError
from ztgi.services.tokenizer.image_decoder import decode_image
from ztgi.services.tokenizer.raw_tensor import raw_tensor, tensors_digest

MAX_TENSOR_BYTES = MAX_IMAGE_BYTES_PER_MESSAGE  # of one request's images: what a frame leaves them (codec)


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
    """One image ready for the prompt: its processor's tensors for it alone, their digest, and the
    text that replaces its placeholder (holding `num_tokens` placeholders)."""

    tensors: list[RawTensor]
    digest: bytes
    replacement: str
    num_tokens: int

    @property
    def num_bytes(self) -> int:
        return sum(len(tensor.data) for tensor in self.tensors)


class VisionProcessor:
    """The image side of one model family; subclasses say what the processor's outputs are and what
    the placeholder becomes."""

    image_string = ""  # one image in a prompt before expansion
    placeholder = ""  # the token `expand` multiplies (the config's `image_token_id`)

    def __init__(self, image_processor: Any, image_token_id: int, max_image_pixels: int) -> None:
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.max_image_pixels = max_image_pixels

    def process(self, files: list[bytes]) -> list[ProcessedImage]:
        """Every file of a request, in order; ValidationError naming the first one refused, or the
        request's images together when their tensors would not fit in a message."""
        processed: list[ProcessedImage] = []
        num_bytes = 0
        for number, data in enumerate(files, start=1):
            processed.append(self._process_one(data, number))
            num_bytes += processed[-1].num_bytes
            if num_bytes > MAX_TENSOR_BYTES:
                raise ValidationError("images", f"the request's images make more than {MAX_TENSOR_BYTES >> 20} MiB "
                                                f"of pixel data (over {number} images): send fewer or smaller images")
        return processed

    def expand(self, text: str, images: list[ProcessedImage]) -> str:
        """`text` with its i-th placeholder replaced by image i's tokens; it must hold one per image."""
        pieces = text.split(self.placeholder)
        if len(pieces) != len(images) + 1:
            raise ValidationError("images", f"the prompt has {len(pieces) - 1} image placeholders "
                                            f"({self.placeholder}) for {len(images)} images")
        return pieces[0] + "".join(image.replacement + piece for image, piece in zip(images, pieces[1:]))

    def _process_one(self, data: bytes, number: int) -> ProcessedImage:
        image = decode_image(data, number, self.max_image_pixels)
        try:
            outputs, replacement = self._prepare(image)
        except Exception as exc:  # the processor's own refusals (too small, too thin) are ValueErrors
            raise ValidationError("images", f"image {number} ({image.width}x{image.height} pixels) cannot be "
                                            f"processed for this model: {exc}") from None
        tensors = [raw_tensor(name, array) for name, array in outputs.items()]
        return ProcessedImage(tensors, tensors_digest(tensors), replacement, replacement.count(self.placeholder))

    def _prepare(self, image: Image.Image) -> tuple[dict[str, np.ndarray], str]:
        """The processor's outputs for `image` alone, and the text its placeholder becomes."""
        raise NotImplementedError


class Idefics3VisionProcessor(VisionProcessor):
    """Idefics3 and SmolVLM: tiles of the image plus the whole image, `image_seq_len` tokens each."""

    image_string = placeholder = "<image>"
    fake_token = "<fake_token_around_image>"
    global_token = "<global-img>"

    def __init__(self, image_processor: Any, image_token_id: int, max_image_pixels: int, image_seq_len: int) -> None:
        super().__init__(image_processor, image_token_id, max_image_pixels)
        self.image_seq_len = image_seq_len

    def _prepare(self, image: Image.Image) -> tuple[dict[str, np.ndarray], str]:
        outputs = self.image_processor([[image]], return_row_col_info=True, return_tensors="np",
                                       input_data_format="channels_last")
        # the mask as bool (the model reads it as one): 8 times fewer bytes on the wire than int64
        arrays = {"pixel_values": outputs["pixel_values"], "pixel_attention_mask": outputs["pixel_attention_mask"] != 0}
        return arrays, self._replacement(int(outputs["rows"][0][0]), int(outputs["cols"][0][0]))

    def _replacement(self, rows: int, cols: int) -> str:
        image = self.placeholder * self.image_seq_len
        whole = f"{self.fake_token}{self.global_token}{image}{self.fake_token}"
        if rows == 0 and cols == 0:
            return whole
        lines = ["".join(f"{self.fake_token}<row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n"
                 for r in range(rows)]
        return "".join(lines) + "\n" + whole


class Qwen2VLVisionProcessor(VisionProcessor):
    """Qwen2-VL: patches of the resized image, merged merge_size x merge_size into one token each."""

    image_string = "<|vision_start|><|image_pad|><|vision_end|>"
    placeholder = "<|image_pad|>"

    def _prepare(self, image: Image.Image) -> tuple[dict[str, np.ndarray], str]:
        outputs = self.image_processor([image], return_tensors="np", input_data_format="channels_last")
        arrays = {name: outputs[name] for name in ("pixel_values", "image_grid_thw")}
        num_tokens = int(np.prod(arrays["image_grid_thw"][0])) // self.image_processor.merge_size ** 2
        return arrays, self.placeholder * num_tokens
