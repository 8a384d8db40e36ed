"""Nested records carried inside messages."""

from __future__ import annotations

from typing import Literal

from common.codec import record

__all__ = [
    "Grammar", "GrammarType", "Tool", "ToolCall", "ChatMessage", "GenerateParameters", "SamplingParameters",
    "WorkerRequest", "Batch", "CachedBatch", "Generation", "Timings", "RequestKey", "Token", "FinalDetails",
    "StreamEvent", "WorkerInfo", "FinishReason", "SeqUpdate",
]

FinishReason = Literal["length", "eos_token", "stop_sequence", "cancelled", "error"]
GrammarType = Literal["json", "regex", "lark"]


@record
class Grammar:
    """A constraint on the generated text (TGI's `grammar`): `value` is a JSON Schema as JSON
    text (`json`), a regular expression (`regex`), or a Lark grammar (`lark`, what tool calls use;
    llguidance's syntax, JSON schemas embedded as `%json{...}`)."""

    type: GrammarType
    value: str


@record
class Tool:
    """A function a chat model may call: `parameters` is its arguments' JSON Schema as JSON text."""

    name: str
    description: str | None
    parameters: str


@record
class ToolCall:
    """A call an assistant made (OpenAI's `tool_calls` item): `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


@record
class ChatMessage:
    """One chat turn; structured OpenAI content is flattened to text by the gateway.

    An assistant turn may carry the `tool_calls` it made; a `tool` turn answers the call
    `tool_call_id`.
    """

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


@record
class GenerateParameters:
    """TGI's generation parameters as a client sends them (None: the server default).

    Ranges are checked by the gateway (HTTP 422) and again by the tokenizer for direct clients.
    """

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    seed: int | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    watermark: bool = False
    stop: list[str] = ()  # type: ignore[assignment]
    truncate: int | None = None
    details: bool = False
    decoder_input_details: bool = False
    top_n_tokens: int | None = None
    return_full_text: bool = False
    ignore_eos: bool = False
    add_special_tokens: bool = True
    presence_penalty: float | None = None  # OpenAI's; last so the older fields keep their places
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", list(self.stop))


@record
class SamplingParameters:
    """How a worker chooses the next token for one request (TGI's NextTokenChooserParameters).

    Applied in TGI's order: watermark, repetition penalty, frequency penalty (then OpenAI's
    presence penalty), the grammar's mask, then temperature, top_k, top_p, typical_p; greedy unless do_sample.
    Neutral values leave logits untouched.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    do_sample: bool = False
    seed: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    watermark: bool = False
    presence_penalty: float = 0.0  # last: added after the others, the older fields keep their places
    grammar: Grammar | None = None  # the grammar mask comes after the penalties, before temperature


@record
class WorkerRequest:
    """One request as the worker sees it: ids in, ids out, no text.

    `request_id` is the scheduler's integer id for the request (unique per scheduler run).
    On a paged worker the scheduler owns the KV blocks (TGI v3's router): `block_ids` is the
    request's block table so far, `cache_len` how many of `input_ids` already have their keys
    and values in those blocks, and `chunk_len` how many of the rest this step computes (None:
    all of them; a longer prompt is prefilled in chunks over several steps).
    """

    request_id: int
    input_ids: list[int]
    sampling: SamplingParameters
    max_new_tokens: int
    ignore_eos: bool = False
    top_n_tokens: int = 0
    prefill_logprobs: bool = False
    block_ids: list[int] = ()  # type: ignore[assignment]
    cache_len: int = 0
    chunk_len: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.block_ids, tuple):
            object.__setattr__(self, "block_ids", list(self.block_ids))


@record
class SeqUpdate:
    """A paged step's news about a cached request: blocks added to the end of its block table,
    and, while its prompt is still being prefilled, how many prompt tokens this step computes
    (None: the request decodes one token)."""

    request_id: int
    new_block_ids: list[int]
    chunk_len: int | None = None


@record
class Batch:
    """A new batch for Prefill; `max_tokens` is its token budget (inputs + new tokens)."""

    batch_id: int
    requests: list[WorkerRequest]
    max_tokens: int


@record
class CachedBatch:
    """The worker's summary of a batch it keeps cached after a step."""

    batch_id: int
    request_ids: list[int]
    max_tokens: int

    @property
    def size(self) -> int:
        return len(self.request_ids)


@record
class Generation:
    """One request's output of one step: the chosen token, and on finish the reason.

    `prefill_ids`/`prefill_logprobs` come once, with a request's first token, when asked for
    (the first prefill logprob is NaN: nothing predicts the first prompt token).
    """

    request_id: int
    token_id: int
    logprob: float
    finish_reason: FinishReason | None = None
    generated_tokens: int = 0
    seed: int | None = None
    top_ids: list[int] = ()  # type: ignore[assignment]
    top_logprobs: list[float] = ()  # type: ignore[assignment]
    prefill_ids: list[int] | None = None
    prefill_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        for name in ("top_ids", "top_logprobs"):
            if isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, list(getattr(self, name)))


@record
class Timings:
    """Where a worker step spent its time, in nanoseconds, and what its speculation proposed and
    how many of those tokens were accepted."""

    forward_ns: int = 0
    decode_ns: int = 0
    concatenate_ns: int = 0
    total_ns: int = 0
    num_proposed: int = 0
    num_accepted: int = 0


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
class FinalDetails:
    """What the last event of a request carries besides its text."""

    finish_reason: FinishReason
    generated_tokens: int
    input_tokens: int
    seed: int | None = None
    prefill: list[Token] = ()  # type: ignore[assignment]
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    def __post_init__(self) -> None:
        if isinstance(self.prefill, tuple):
            object.__setattr__(self, "prefill", list(self.prefill))


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


@record
class WorkerInfo:
    """What a worker tells the scheduler about its model when it registers."""

    model_id: str
    dtype: str
    device: str
    eos_token_ids: list[int]
    vocab_size: int
    max_position_embeddings: int
