"""The `top_n_tokens` of each row of a step (TGI's batch_top_tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_EXTRA_TIES = 8
"""Tokens tied with the n-th best come along, as in TGI, but at most this many more."""


def top_tokens(logprobs: torch.Tensor, top_n: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids `[batch, k]`, logprobs `[batch, k]` (best first) and per-row counts `[batch]`.

    Row i keeps its first counts[i] entries: the `top_n[i]` best tokens plus any tied with the
    n-th (never a filtered, -inf token); counts[i] = 0 when the row asked for none.
    """
    max_n = min(max(top_n), logprobs.shape[-1])
    n = torch.tensor(top_n, device=logprobs.device).clamp_max(max_n).unsqueeze(1)
    best = torch.topk(logprobs, max_n, dim=-1).values
    nth = best.gather(1, (n - 1).clamp_min(0))
    kept = (logprobs >= nth) & torch.isfinite(logprobs)
    counts = kept.sum(dim=1).clamp_max(n.squeeze(1) + MAX_EXTRA_TIES).masked_fill(n.squeeze(1) == 0, 0)
    k = max(1, min(max_n + MAX_EXTRA_TIES, logprobs.shape[-1]))
    top = torch.topk(logprobs, k, dim=-1, sorted=True)
    return top.indices, top.values, counts


def row_top_tokens(logprobs: torch.Tensor, top_n: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's `top_n` best ids and logprobs (ties as `top_tokens`), as lists: a prompt's
    positions, which all ask for the same number."""
    ids, values, counts = top_tokens(logprobs, [top_n] * logprobs.shape[0])
    num_kept = counts.tolist()
    return ([row[:count] for row, count in zip(ids.tolist(), num_kept)],
            [row[:count] for row, count in zip(values.tolist(), num_kept)])
