"""What both engines' warmups share: the checks of a `Warmup` command against the model's limits,
the synthetic prompt's token stride, and the share of free CUDA memory the KV cache takes."""

from __future__ import annotations

from ztgi.common.messages import Warmup
from ztgi.services.worker.models.request_checks import ModelLimits

CUDA_MEMORY_FRACTION = 0.9
TOKEN_STRIDE = 7919  # a prime: synthetic prompts cycle through the vocabulary, not one repeated token


def validate_warmup(model: ModelLimits, command: Warmup) -> None:
    """ValueError naming the limit of `command` that no warmup can meet on `model`."""
    if command.max_input_tokens < 1:
        raise ValueError(f"`max_input_tokens` must be >= 1, got {command.max_input_tokens}")
    if command.max_total_tokens <= command.max_input_tokens:
        raise ValueError(f"`max_total_tokens` ({command.max_total_tokens}) must be greater than "
                         f"`max_input_tokens` ({command.max_input_tokens})")
    if command.max_batch_prefill_tokens < command.max_input_tokens:
        raise ValueError(f"`max_batch_prefill_tokens` ({command.max_batch_prefill_tokens}) must be >= "
                         f"`max_input_tokens` ({command.max_input_tokens})")
    if command.max_total_tokens > model.max_position_embeddings:
        raise ValueError(f"`max_total_tokens` ({command.max_total_tokens}) exceeds the model's "
                         f"{model.max_position_embeddings} positions")


def require_room_for_one_request(kv_tokens: int, command: Warmup) -> None:
    """ValueError when the KV cache cannot hold one request of `max_total_tokens`: naming both
    numbers and the flags that change them (the worker then exits: no later warmup can pass)."""
    if kv_tokens < command.max_total_tokens:
        raise ValueError(f"the KV cache holds {kv_tokens} tokens, less than one request's max_total_tokens "
                         f"({command.max_total_tokens}): lower --max-total-tokens (with --max-input-tokens "
                         "below it), or give the cache more room: --memory-budget-mb on CPU, "
                         "--max-batch-total-tokens when it is set")
