"""Embeddings on the paged engine: an `embed` request's final hidden states pooled into one vector.

An embedding request is a prefill like any other, chunked like any other, beside other requests'
decodes. Each step asks the forward for the final norm's output at the rows the pooling needs
(`rows`): the last prompt token's (last), the first's (cls) or every prompt token's (mean, summed
chunk by chunk in float32). When the prompt is all computed the vector is divided out, L2-normalised
and sent with the request's one token as little-endian float32 bytes.
"""

from __future__ import annotations

import torch

from ztgi.services.worker.paged.batch import Sequence

CANNOT_POOL = "this worker's model cannot be pooled into an embedding"


class Pooler:
    """Pools by `mode` (last, mean or cls; `models/pooling.py`); None: the model cannot pool (`error`)."""

    def __init__(self, mode: str | None, error: str | None = None) -> None:
        self.mode = mode
        self.error = error or CANNOT_POOL

    def rows(self, sequence: Sequence, start: int, count: int, row: int) -> list[int]:
        """The step's rows whose hidden states `sequence` pools, its tokens `[start, start + count)`
        running at rows `[row, row + count)`."""
        if not sequence.request.embed or self.mode is None or start >= sequence.prompt_len:
            return []
        end = min(start + count, sequence.prompt_len)
        if self.mode == "mean":
            return list(range(row, row + end - start))
        if self.mode == "cls":
            return [row] if start == 0 else []
        return [row + end - start - 1] if end == sequence.prompt_len else []

    @staticmethod
    def add(sequence: Sequence, hidden: torch.Tensor) -> None:
        """Adds the sequence's rows of this step (`[rows, hidden]`) to what it pooled so far."""
        total = hidden.float().sum(dim=0)
        sequence.pooled = total if sequence.pooled is None else sequence.pooled + total

    def finish(self, sequence: Sequence) -> bytes | None:
        """The normalised embedding once the prompt is computed; None where nothing was pooled."""
        if sequence.pooled is None:
            return None
        vector = sequence.pooled / sequence.prompt_len if self.mode == "mean" else sequence.pooled
        vector = torch.nn.functional.normalize(vector, dim=0)
        sequence.pooled = None
        return vector.to(device="cpu", dtype=torch.float32).numpy().astype("<f4").tobytes()
