"""Images in a paged step: encoded as their spans start to prefill, their rows put over the placeholders'.

Before a step, every sequence whose next tokens reach an image token it has no embeddings for gets
its images located (and, with Qwen2-VL, its multimodal positions) and the reached images encoded,
whole, once. A sequence whose image cannot be encoded ends with an error; the others run. After the
step, images whose spans the prefill has passed are dropped.
"""

from __future__ import annotations

import logging
import math

import torch

from ztgi.common.messages import Generation
from ztgi.services.worker.paged.batch import PagedBatch, Sequence
from ztgi.services.worker.paged.step_inputs import Entry
from ztgi.services.worker.vision.vision_encoder import ImageError, VisionEncoder

logger = logging.getLogger(__name__)


class ImageEmbeddings:
    """The model's vision encoder (None: a text-only model, which refuses images) applied to a batch's images."""

    def __init__(self, encoder: VisionEncoder | None) -> None:
        self.encoder = encoder

    def prepare(self, batch: PagedBatch) -> list[Generation]:
        """Encodes what the step will need; the error generations of the sequences it stopped."""
        failures = []
        for sequence in batch.sequences:
            if sequence.images is None:
                continue
            start, count = sequence.next_span()
            if count == 0 or (sequence.images.located and start >= sequence.prompt_len):
                continue
            try:
                self._prepare(sequence, start, count)
            except ImageError as exc:
                failures.append(self._fail(sequence, str(exc)))
        return failures

    def _prepare(self, sequence: Sequence, start: int, count: int) -> None:
        images = sequence.images
        assert images is not None
        if self.encoder is None:
            raise ImageError("this model does not take images")
        if not images.located:
            images.locate(sequence.request.input_ids, self.encoder)
        for index in images.needed(start, count):
            if index not in images.embeddings:
                images.embeddings[index] = self.encoder.encode(images.images[index])

    @staticmethod
    def _fail(sequence: Sequence, error: str) -> Generation:
        message = f"request {sequence.seq_id}: {error}"
        logger.warning("%s", message)
        stopping = sequence.stopping
        stopping.finish_reason = "error"
        return Generation(seq_id=sequence.seq_id, token_id=0, logprob=math.nan, finish_reason="error",
                          generated_tokens=stopping.num_generated, error=message)

    @staticmethod
    def rows(sequences: list[Sequence], entries: list[Entry],
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step rows of image tokens and their embeddings; None where the step has none."""
        step_rows: list[int] = []
        parts: list[torch.Tensor] = []
        for e in entries:
            images = sequences[e.index].images
            if images is not None and images.embeddings:
                entry_rows, entry_parts = images.rows(e.start, e.count, e.row)
                step_rows.extend(entry_rows)
                parts.extend(entry_parts)
        if not step_rows:
            return None
        return torch.tensor(step_rows, dtype=torch.int64, device=device), torch.cat(parts)

    @staticmethod
    def release(batch: PagedBatch) -> None:
        """Drops the embeddings of images whose spans are computed."""
        for sequence in batch.sequences:
            if sequence.images is not None and sequence.images.embeddings:
                sequence.images.release(sequence.num_computed)
