"""The Kirchenbauer et al. (2023) watermark, as TGI applies it ("A Watermark for Large Language Models").

At each step the previous token seeds a generator that splits the vocabulary at random into a
"green" fraction `gamma` and a red rest; `delta` is added to the green tokens' logits before any
other processor. Generated text then holds far more green tokens than chance, which `z_score`
detects from the token ids alone, given the same `gamma` and hash key. TGI's defaults: gamma 0.5,
delta 2.0, hash key 15485863 (a large prime), seeded by the single previous token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

HASH_KEY = 15485863


@dataclass(frozen=True)
class WatermarkSettings:
    """Strength of the watermark: the green fraction of the vocabulary and the logit bias it gets."""

    gamma: float = 0.5
    delta: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"watermark gamma must be > 0 and < 1, got {self.gamma}")
        if not math.isfinite(self.delta) or self.delta < 0:
            raise ValueError(f"watermark delta must be finite and >= 0, got {self.delta}")


settings = WatermarkSettings()


def configure(gamma: float, delta: float) -> None:
    """Sets the worker-wide strength (from the worker's config, once at start-up)."""
    global settings
    settings = WatermarkSettings(gamma, delta)


def greenlist_ids(previous_token: int, vocab_size: int, gamma: float) -> torch.Tensor:
    """The green token ids that follow `previous_token`: the first `gamma` of a seeded permutation."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(HASH_KEY * previous_token)
    return torch.randperm(vocab_size, generator=generator)[: int(vocab_size * gamma)]


def apply(scores: torch.Tensor, previous_tokens: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """Adds delta to the green logits of each row in `rows`; other rows come out unchanged.

    `previous_tokens` is `[batch]`, each row's last token. One permutation per watermarked row: the
    green list depends on that row's own previous token.
    """
    vocab_size = scores.shape[-1]
    previous = previous_tokens.tolist()
    bias = torch.zeros_like(scores)
    for row in rows:
        green = greenlist_ids(previous[row], vocab_size, settings.gamma).to(scores.device)
        bias[row, green] = settings.delta
    return scores + bias


def z_score(token_ids: Sequence[int], vocab_size: int, gamma: float | None = None) -> float:
    """How many standard deviations the green count of `token_ids[1:]` is above chance.

    Each token is scored against the green list its predecessor seeds; above 4 is strong evidence
    of the watermark, near 0 is unwatermarked text.
    """
    gamma = settings.gamma if gamma is None else gamma
    num_scored = len(token_ids) - 1
    if num_scored < 1:
        raise ValueError("need at least two tokens to score a watermark")
    num_green = sum(
        int(token in set(greenlist_ids(previous, vocab_size, gamma).tolist()))
        for previous, token in zip(token_ids, token_ids[1:]))
    expected = gamma * num_scored
    return (num_green - expected) / math.sqrt(num_scored * gamma * (1 - gamma))
