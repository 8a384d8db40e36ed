"""A sequence's images: where their placeholder tokens are, and their embeddings while the prefill needs them.

An image is encoded whole when the first step that computes one of its placeholder tokens runs
(a chunk may start or end anywhere in its span, a resumed request may start inside it); its rows
stay here until the prefill has passed the span's end, then go.
"""

from __future__ import annotations

import bisect
import dataclasses

import torch

from ztgi.common.messages.images import EncodedImage
from ztgi.services.worker.vision.mrope_positions import MropePositions
from ztgi.services.worker.vision.vision_encoder import ImageError, VisionEncoder


@dataclasses.dataclass(eq=False)
class PromptImages:
    """The images of one request's prompt, located on its first step (`locate`)."""

    images: list[EncodedImage]
    placeholders: list[list[int]] | None = None  # per image, its image tokens' prompt positions, in order
    embeddings: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # image -> [num_tokens, hidden]
    rope: MropePositions | None = None  # Qwen2-VL: every token's (t, h, w) position

    @property
    def located(self) -> bool:
        return self.placeholders is not None

    def locate(self, input_ids: list[int], encoder: VisionEncoder) -> None:
        """Finds each image's placeholders in its span (and with mrope, the prompt's positions);
        ImageError where a span is out of the prompt, overlaps another, or holds a number of image
        tokens other than the image's `num_tokens`."""
        placeholders, previous_end = [], 0
        for image in self.images:
            if not previous_end <= image.start < image.end <= len(input_ids):
                raise ImageError(f"the image span [{image.start}, {image.end}) must lie in the prompt's "
                                 f"{len(input_ids)} tokens, after the previous image's (ending at {previous_end})")
            found = [p for p in range(image.start, image.end) if input_ids[p] == encoder.image_token_id]
            if len(found) != image.num_tokens:
                raise ImageError(f"the image span [{image.start}, {image.end}) holds {len(found)} image tokens "
                                 f"(id {encoder.image_token_id}), the image {image.num_tokens}")
            placeholders.append(found)
            previous_end = image.end
        if encoder.uses_mrope:
            self.rope = self._rope(len(input_ids), placeholders, encoder)
        self.placeholders = placeholders

    def _rope(self, num_tokens: int, placeholders: list[list[int]], encoder: VisionEncoder) -> MropePositions:
        runs = []
        for image, found in zip(self.images, placeholders):
            if found and found[-1] - found[0] + 1 != len(found):
                raise ImageError(f"the image tokens of the span [{image.start}, {image.end}) must be one run")
            runs.append((found[0] if found else image.start, len(found), encoder.grid(image)))
        assert encoder.spatial_merge_size is not None
        try:
            return MropePositions.for_prompt(num_tokens, runs, encoder.spatial_merge_size)
        except ValueError as exc:
            raise ImageError(str(exc)) from None

    def needed(self, start: int, count: int) -> list[int]:
        """The images with a placeholder token in `[start, start + count)`."""
        assert self.placeholders is not None
        return [index for index, found in enumerate(self.placeholders)
                if found and found[0] < start + count and found[-1] >= start]

    def rows(self, start: int, count: int, row: int) -> tuple[list[int], list[torch.Tensor]]:
        """For tokens `[start, start + count)` fed at rows from `row`: the step rows of the image
        tokens among them, and their embeddings (slices of the encoded images, in the same order)."""
        assert self.placeholders is not None
        step_rows: list[int] = []
        parts: list[torch.Tensor] = []
        for index in self.needed(start, count):
            found = self.placeholders[index]
            first, last = bisect.bisect_left(found, start), bisect.bisect_left(found, start + count)
            step_rows.extend(row + position - start for position in found[first:last])
            parts.append(self.embeddings[index][first:last])
        return step_rows, parts

    def release(self, num_computed: int) -> None:
        """Drops the embeddings of images whose span the prefill has passed."""
        for index in [i for i in self.embeddings if self.images[i].end <= num_computed]:
            del self.embeddings[index]
