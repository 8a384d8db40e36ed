"""Token embeddings, scaled by `sqrt(hidden)` in the weights' dtype where the family does (Gemma)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.transformers_module import TransformersModule


def replace_rows(x: torch.Tensor, replaced: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """`x` with rows `replaced[0]` set to `replaced[1]` (an image's embeddings over its placeholder
    tokens'), in place; `x` itself without."""
    if replaced is None:
        return x
    rows, values = replaced
    return x.index_copy_(0, rows, values)


class Embedding:
    """Rows of the embedding matrix for token ids, times the family's scale if it has one."""

    def __init__(self, module: TransformersModule) -> None:
        self.weight = module.weight.detach().clone()
        scale = getattr(module, "embed_scale", None)  # Gemma's scaled embedding keeps it as a buffer
        self.scale = None if scale is None else torch.as_tensor(scale).to(self.weight.dtype)

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, self.weight)
        return x if self.scale is None else x * self.scale
