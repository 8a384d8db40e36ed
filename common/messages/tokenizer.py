"""Messages a tokenizer receives from the scheduler."""

from __future__ import annotations

from ztgi.common.codec import message, record
from ztgi.common.messages.batches import Generation
from ztgi.common.messages.events import RequestKey
from ztgi.common.messages.parameters import GenerateParameters
from ztgi.common.messages.scheduler import Encoded, Generate, TokenizeQuery

__all__ = ["EncodeJob", "TokenStep", "DetokenizeJob", "Forget", "Adopt", "TokenizeJob"]


@message("encode_job")
class EncodeJob:
    """Encode this client request; answer with Encoded or Rejected on `tokenized`.

    `scheduler_nonce` is the sending scheduler's boot nonce: the tokenizer drops the state of a
    scheduler that restarted, and an encode job may arrive before the new scheduler's heartbeat.
    """

    key: RequestKey
    generate: Generate
    scheduler_nonce: str = ""


@record
class TokenStep:
    """One request's token of one step, addressed by its key; `cached_tokens`: how many of its
    prompt tokens the worker took from the prefix cache (for the final event's details)."""

    key: RequestKey
    generation: Generation
    cached_tokens: int = 0


@message("detokenize_job")
class DetokenizeJob:
    """All tokens of one step for the requests this tokenizer owns; its TextBatch names `job_id`."""

    steps: list[TokenStep]
    job_id: int = 0


@message("forget")
class Forget:
    """Drop the decode state of these requests (cancelled or failed elsewhere)."""

    keys: list[RequestKey]


@message("adopt")
class Adopt:
    """Take over a request whose tokenizer was lost.

    `emitted_ids` are the tokens whose text the client already has: the new owner replays them
    silently to rebuild the decode state, then streams the tokens that follow.
    """

    encoded: Encoded
    parameters: GenerateParameters
    emitted_ids: list[int]


@message("tokenize_job")
class TokenizeJob:
    """Tokenize a client's text with offsets; answer with TokenizeDone on `detokenize`."""

    job_id: int
    query: TokenizeQuery
