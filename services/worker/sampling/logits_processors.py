"""TGI's heterogeneous logits processors: one parameter per batch row, applied to all rows at once.

Every function takes scores `[batch, vocab]` and a per-row parameter column `[batch, 1]`, and
returns the processed scores. A row whose parameter is neutral comes out unchanged, so one call
serves a batch that mixes requests with and without the option.
"""

from __future__ import annotations

import torch

FILTERED = -float("inf")


def token_counts(scores: torch.Tensor, token_ids: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """How often each vocabulary token occurs in each row's sequence so far (prompt + generated).

    `token_ids`/`token_mask` are the batch's left-padded tokens and attention mask: padding adds 0.
    """
    counts = torch.zeros_like(scores)
    return counts.scatter_add_(1, token_ids, token_mask.to(scores.dtype))


def repetition_penalty(scores: torch.Tensor, counts: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """CTRL's penalty on every token already present: positive scores divided, negative multiplied."""
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(counts > 0, penalized, scores)


def frequency_penalty(scores: torch.Tensor, counts: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """TGI's frequency penalty: minus `penalty` x the token's frequency among all previous tokens
    (its count divided by the sequence length)."""
    lengths = counts.sum(dim=1, keepdim=True).clamp_min(1.0)
    return scores - penalty * (counts / lengths)


def presence_penalty(scores: torch.Tensor, counts: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """OpenAI's presence penalty: minus `penalty` once for every token already present, however
    often (a flat charge for repeating at all, where the frequency penalty grows with the count)."""
    return scores - penalty * (counts > 0).to(scores.dtype)


def logit_bias(scores: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor, biases: torch.Tensor) -> torch.Tensor:
    """OpenAI's `logit_bias`: `biases[i]` added to row `rows[i]`'s score of `token_ids[i]` (a copy:
    the step's logits stay as the model gave them)."""
    return scores.index_put((rows, token_ids), biases, accumulate=True)


def temperature(scores: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return scores / value


def top_k(scores: torch.Tensor, k: torch.Tensor, max_k: int) -> torch.Tensor:
    """Keeps each row's k highest scores (ties with the k-th kept too); k = 0 keeps everything.

    `max_k` is the largest k of the batch, known on the host (no device sync to find it).
    """
    max_k = min(max_k, scores.shape[-1])
    k = k.clamp_max(max_k)
    kth = torch.topk(scores, max_k, dim=-1).values.gather(1, (k - 1).clamp_min(0))
    kth = kth.masked_fill(k == 0, FILTERED)
    return scores.masked_fill(scores < kth, FILTERED)


def top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose probability reaches p; p = 1 keeps all."""
    sorted_scores, sorted_ids = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)
    remove[:, -1] = False  # the most likely token always stays
    return scores.masked_fill(remove.scatter(1, sorted_ids, remove), FILTERED)


def typical_p(scores: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling: keeps the tokens whose surprise is closest to the entropy, until
    their probability reaches `mass`; mass = 1 keeps all."""
    logprobs = torch.log_softmax(scores, dim=-1)
    entropy = -(logprobs * logprobs.exp()).nansum(dim=-1, keepdim=True)
    shifted = torch.abs(-logprobs - entropy)
    sorted_shifted, sorted_ids = torch.sort(shifted, descending=False)
    cumulative = scores.gather(1, sorted_ids).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1, keepdim=True).clamp_max(scores.shape[-1] - 1)
    last = last.masked_fill(mass >= 1.0, scores.shape[-1] - 1)
    remove = sorted_shifted > sorted_shifted.gather(1, last)
    return scores.masked_fill(remove.scatter(1, sorted_ids, remove), FILTERED)
