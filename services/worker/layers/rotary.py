"""Rotary position embeddings through transformers' own modules, so every rope scaling they know
(linear, dynamic, yarn, llama3, Phi-3's longrope, Gemma 3's local and global bases) is exact."""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.transformers_module import TransformersModule


class Rotary:
    """cos/sin per token for a flat step, and their application (halves, partial rotary allowed)."""

    def __init__(self, module: TransformersModule, by_layer_type: bool = False) -> None:
        self.module = module
        self.by_layer_type = by_layer_type  # Gemma 3: one module, a base per layer type

    def cos_sin(self, x: torch.Tensor, positions: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`[tokens, 1, rotary_dim]` each, for `x` `[tokens, hidden]` and `positions` `[tokens]`, or
        `[3, tokens]` (Qwen2-VL's temporal, height and width: its module splits the rotary dims among
        them by `mrope_section`, and takes a `[tokens]` step's as all three)."""
        args = (layer_type,) if self.by_layer_type else ()
        batched = positions[None] if positions.dim() == 1 else positions[:, None]
        cos, sin = self.module(x[None], batched, *args)
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` (halves, not interleaved) on `[..., head_dim]` with `cos`/`sin`
    broadcast to it; dimensions past the rotary ones (Phi-3's partial rotary factor) pass unchanged."""
    dim = cos.shape[-1]
    rotated, passed = (x, None) if dim == x.shape[-1] else (x[..., :dim], x[..., dim:])
    half = dim // 2
    out = rotated * cos + torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1) * sin
    return out if passed is None else torch.cat((out, passed), dim=-1)
