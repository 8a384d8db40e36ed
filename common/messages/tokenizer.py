"""Messages a tokenizer receives from the scheduler."""

from __future__ import annotations

from common.codec import message, record
from common.messages.records import Generation, RequestKey
from common.messages.scheduler import Generate

__all__ = ["EncodeJob", "TokenStep", "DetokenizeJob", "Forget"]


@message("encode_job")
class EncodeJob:
    """Encode this client request; answer with Encoded or Rejected on `tokenized`."""

    key: RequestKey
    generate: Generate


@record
class TokenStep:
    """One request's token of one step, addressed by its key."""

    key: RequestKey
    generation: Generation


@message("detokenize_job")
class DetokenizeJob:
    """All tokens of one step for the requests this tokenizer owns."""

    steps: list[TokenStep]


@message("forget")
class Forget:
    """Drop the decode state of these requests (cancelled or failed elsewhere)."""

    keys: list[RequestKey]
