"""A step's chosen tokens as rows for the host, and the Generation each request gets."""

from __future__ import annotations

import dataclasses

import torch

from ztgi.common.messages import Generation
from ztgi.services.worker.sampling.stopping_criteria import StoppingCriteria
from ztgi.services.worker.sampling.top_tokens import top_tokens


def step_rows(next_ids: torch.Tensor, logprobs: torch.Tensor, top_n_tokens: list[int]) -> list[list[float]]:
    """One host transfer per step: per row [token id, logprob, num top, top ids..., top logprobs...]."""
    chosen = logprobs.gather(1, next_ids.unsqueeze(1))
    columns = [next_ids.unsqueeze(1).double(), chosen.double()]
    if any(top_n_tokens):
        top_ids, top_logprobs, counts = top_tokens(logprobs, top_n_tokens)
        columns += [counts.unsqueeze(1).double(), top_ids.double(), top_logprobs.double()]
    return torch.cat(columns, dim=1).tolist()


def top_of_row(row: list[float]) -> tuple[list[int], list[float]]:
    """The top tokens' ids and logprobs of a `step_rows` row."""
    if len(row) == 2:
        return [], []
    count, k = int(row[2]), (len(row) - 3) // 2
    return [int(t) for t in row[3:3 + count]], row[3 + k:3 + k + count]


def failed(generation: Generation, stopping: StoppingCriteria, error: str | None) -> Generation:
    """The generation as it is, or, when the request's grammar failed (`error`), its last: the
    request stops with finish_reason "error" and the reason, which its client gets as an error."""
    if error is None:
        return generation
    stopping.finish_reason = "error"
    return dataclasses.replace(generation, finish_reason="error", error=error)
