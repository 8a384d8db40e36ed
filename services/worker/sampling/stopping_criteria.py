"""Token-level stopping for one request: EOS (unless ignored) and `max_new_tokens`."""

from __future__ import annotations

from ztgi.common.messages import FinishReason


class StoppingCriteria:
    """Counts a request's generated tokens and says when it is done (TGI's StoppingCriteria).

    Text-level stops (stop sequences) belong to the tokenizer; here only token ids matter.
    """

    __slots__ = ("eos_token_ids", "max_new_tokens", "ignore_eos", "num_generated", "finish_reason")

    def __init__(self, eos_token_ids: frozenset[int], max_new_tokens: int, ignore_eos: bool = False) -> None:
        self.eos_token_ids = eos_token_ids
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = ignore_eos
        self.num_generated = 0
        self.finish_reason: FinishReason | None = None

    @property
    def stopped(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_remaining(self) -> int:
        """Tokens this request may still generate (0 once stopped)."""
        return 0 if self.stopped else self.max_new_tokens - self.num_generated

    def __call__(self, token_id: int) -> FinishReason | None:
        """Counts `token_id` as generated; returns the finish reason when it ends the request."""
        self.num_generated += 1
        if not self.ignore_eos and token_id in self.eos_token_ids:
            self.finish_reason = "eos_token"
        elif self.num_generated >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason
