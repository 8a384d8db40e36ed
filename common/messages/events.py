"""The client's side of a request: its key, the tokens and events it streams, what its last event carries."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import record

__all__ = ["RequestKey", "Token", "TopTokens", "FinalDetails", "StreamEvent", "FinishReason"]

FinishReason = Literal["length", "eos_token", "stop_sequence", "cancelled", "error"]


@record
class RequestKey:
    """A request's identity everywhere outside the worker: (client identity, client's id)."""

    client_id: bytes
    request_id: str


@record
class Token:
    """A token as a client sees it (TGI's Token schema)."""

    id: int
    text: str
    logprob: float | None
    special: bool


@record
class TopTokens:
    """The likeliest tokens at one prompt position, best first."""

    tokens: list[Token]


@record
class FinalDetails:
    """What the last event of a request carries besides its text."""

    finish_reason: FinishReason
    generated_tokens: int
    input_tokens: int
    seed: int | None = None
    prefill: list[Token] = ()  # type: ignore[assignment]
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    prefill_top_tokens: list[TopTokens] = ()  # type: ignore[assignment]  # with top_n_tokens: per prompt token
    embedding: bytes | None = None  # an `embed` request's pooled vector: float32, little-endian

    def __post_init__(self) -> None:
        for name in ("prefill", "prefill_top_tokens"):
            if isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, list(getattr(self, name)))


@record
class StreamEvent:
    """One event of a request's stream: a token, and on the last event the whole text.

    An error event has `error` set (and `error_type`, TGI's names: validation, overloaded,
    generation, unhealthy, cancelled) and ends the stream.
    """

    request_id: str
    token: Token | None = None
    top_tokens: list[Token] = ()  # type: ignore[assignment]
    generated_text: str | None = None
    details: FinalDetails | None = None
    error: str | None = None
    error_type: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.top_tokens, tuple):
            object.__setattr__(self, "top_tokens", list(self.top_tokens))

    @property
    def is_final(self) -> bool:
        return self.generated_text is not None or self.error is not None
