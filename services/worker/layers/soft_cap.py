"""Gemma 2's logit soft-capping: `cap * tanh(x / cap)`, for attention scores and final logits."""

from __future__ import annotations

import torch


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap
