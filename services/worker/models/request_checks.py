"""Checks of a batch's requests against the model, shared by every batch layout: each failure is a
ValueError that names the request and the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ztgi.common.messages import WorkerRequest
from ztgi.services.worker.sampling.next_token_chooser import NextTokenChooser


class ModelLimits(Protocol):
    """What requests and warmup commands are checked against."""

    vocab_size: int
    max_position_embeddings: int


class BatchModel(ModelLimits, Protocol):
    """What a batch reads of its model when it is built from requests."""

    device: torch.device
    eos_token_ids: frozenset[int]


def chooser_for(requests: Sequence[WorkerRequest], device: torch.device, vocab_size: int) -> NextTokenChooser:
    """The requests' chooser, each resumed request's row replayed over the tokens it generated
    before (`WorkerRequest.num_generated`)."""
    chooser = _new_chooser(requests, device)
    for row, request in enumerate(requests):
        if request.num_generated:
            chooser.replay(row, request.input_ids[-request.num_generated:], vocab_size)
    return chooser


def _new_chooser(requests: Sequence[WorkerRequest], device: torch.device) -> NextTokenChooser:
    try:
        return NextTokenChooser.from_params([r.sampling for r in requests], device)
    except ValueError:
        for request in requests:  # name the request whose parameters are wrong
            try:
                NextTokenChooser.from_params([request.sampling], torch.device("cpu"))
            except ValueError as exc:
                raise ValueError(f"request {request.seq_id}: {exc}") from None
        raise


def validate_requests(requests: Sequence[WorkerRequest], batch_id: int, model: ModelLimits) -> None:
    if not requests:
        raise ValueError(f"batch {batch_id} has no requests")
    for request in requests:
        validate_request(request, model)
    require_unique([r.seq_id for r in requests])


def validate_request(request: WorkerRequest, model: ModelLimits) -> None:
    where = f"request {request.seq_id}"
    if not request.input_ids:
        raise ValueError(f"{where}: `input_ids` is empty")
    if min(request.input_ids) < 0 or max(request.input_ids) >= model.vocab_size:
        raise ValueError(f"{where}: `input_ids` has a token id outside the vocabulary [0, {model.vocab_size})")
    if any(not 0 <= entry.token_id < model.vocab_size for entry in request.sampling.logit_bias or ()):
        raise ValueError(f"{where}: `logit_bias` has a token id outside the vocabulary [0, {model.vocab_size})")
    if request.max_new_tokens < 1:
        raise ValueError(f"{where}: `max_new_tokens` must be >= 1, got {request.max_new_tokens}")
    if not 0 <= request.num_generated < len(request.input_ids):
        raise ValueError(f"{where}: `num_generated` must be >= 0 and below the {len(request.input_ids)} input "
                         f"tokens, got {request.num_generated}")
    if request.top_n_tokens < 0:
        raise ValueError(f"{where}: `top_n_tokens` must be >= 0, got {request.top_n_tokens}")
    total = len(request.input_ids) + request.max_new_tokens
    if total > model.max_position_embeddings:
        raise ValueError(f"{where}: {len(request.input_ids)} input tokens + `max_new_tokens` "
                         f"{request.max_new_tokens} exceed the model's {model.max_position_embeddings} positions")


def require_unique(seq_ids: Sequence[int]) -> None:
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"duplicate request ids in {list(seq_ids)}")
