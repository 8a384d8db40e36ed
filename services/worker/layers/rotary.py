"""Rotary position embeddings through transformers' own modules, so every rope scaling they know
(linear, dynamic, yarn, llama3, Phi-3's longrope, Gemma 3's local and global bases) is exact.

Where the module's frequencies never change (every rope type but dynamic NTK and longrope, which
rescale with the sequence length), each position's cos and sin are the same at every step: they are
computed once by the module itself for positions 0 to a power of two past the largest seen, and a
step on CPU takes its rows from that table, instead of a dozen torch calls rebuilding them. Each
element is the module's own (one product of a frequency and a position, then cos or sin), so the
table's rows equal what it returns for the same positions."""

from __future__ import annotations

import torch

from ztgi.services.worker.layers.transformers_module import TransformersModule


class Rotary:
    """cos/sin per token for a flat step, and their application (halves, partial rotary allowed)."""

    def __init__(self, module: TransformersModule, by_layer_type: bool = False) -> None:
        self.module = module
        self.by_layer_type = by_layer_type  # Gemma 3: one module, a base per layer type
        rope_types = str(getattr(module, "rope_type", "default"))  # Gemma 3: one per layer type
        self.static = "dynamic" not in rope_types and "longrope" not in rope_types
        self._tables: dict[tuple[str | None, torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, x: torch.Tensor, positions: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`[tokens, 1, rotary_dim]` each, for `x` `[tokens, hidden]` and `positions` `[tokens]`, or
        `[3, tokens]` (Qwen2-VL's temporal, height and width: its module splits the rotary dims among
        them by `mrope_section`, and takes a `[tokens]` step's as all three)."""
        # on an accelerator the module's few kernels are cheap and reading the largest position would sync
        if self.static and positions.dim() == 1 and positions.numel() and positions.device.type == "cpu":
            cos, sin = self._table(x, int(positions.max()), layer_type)
            return cos.index_select(0, positions).unsqueeze(1), sin.index_select(0, positions).unsqueeze(1)
        return self._computed(x, positions, layer_type)

    def _computed(self, x: torch.Tensor, positions: torch.Tensor,
                  layer_type: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        args = (layer_type,) if self.by_layer_type else ()
        batched = positions[None] if positions.dim() == 1 else positions[:, None]
        cos, sin = self.module(x[None], batched, *args)
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)

    def _table(self, x: torch.Tensor, largest: int, layer_type: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[capacity, rotary_dim]` in `x`'s dtype for positions 0 to past `largest`."""
        key = (layer_type, x.dtype, x.device)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] <= largest:
            capacity = max(256, 1 << largest.bit_length())
            cos, sin = self._computed(x, torch.arange(capacity, device=x.device), layer_type)
            table = self._tables[key] = (cos[:, 0].contiguous(), sin[:, 0].contiguous())
        return table


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` (halves, not interleaved) on `[..., head_dim]` with `cos`/`sin`
    broadcast to it; dimensions past the rotary ones (Phi-3's partial rotary factor) pass unchanged."""
    dim = cos.shape[-1]
    rotated, passed = (x, None) if dim == x.shape[-1] else (x[..., :dim], x[..., dim:])
    half = dim // 2
    out = rotated * cos + torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1) * sin
    return out if passed is None else torch.cat((out, passed), dim=-1)
