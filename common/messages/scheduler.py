"""Messages the scheduler receives: from clients, tokenizers and workers."""

from __future__ import annotations

from typing import Literal

from ztgi.common.codec import message, record
from ztgi.common.messages.batches import CachedBatch, Generation, Timings
from ztgi.common.messages.chat import ChatMessage, Tool
from ztgi.common.messages.events import RequestKey
from ztgi.common.messages.images import EncodedImage
from ztgi.common.messages.parameters import GenerateParameters, SamplingParameters

__all__ = [
    "Generate", "Cancel", "Query", "Encoded", "Rejected", "ClientOutput", "TextBatch",
    "StepResult", "FilterResult", "WarmupResult", "CommandDone", "CommandFailed", "QueryKind",
    "TokenizeQuery", "TokenizeDone", "LoadAdapter", "UnloadAdapter",
]

QueryKind = Literal["health", "info", "stats"]


@message("generate")
class Generate:
    """A client asks for text: `inputs` (raw prompt), chat `messages` or prompt `input_ids`
    (OpenAI's token-id prompts, checked against the vocabulary by the tokenizer), exactly one of them.

    `tools` (with `messages` only) are rendered into the prompt by the chat template.
    `images` are the files of TGI's markdown images in `inputs` (`![](url)`), in order of appearance,
    as the gateway decoded or fetched them; chat turns carry theirs in their `parts`.
    """

    request_id: str
    inputs: str | None
    messages: list[ChatMessage] | None
    parameters: GenerateParameters
    tools: list[Tool] | None = None
    input_ids: list[int] | None = None
    images: list[bytes] | None = None

    def __post_init__(self) -> None:
        if sum(prompt is not None for prompt in (self.inputs, self.messages, self.input_ids)) != 1:
            raise ValueError("exactly one of inputs, messages and input_ids must be given")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools need messages")


@message("cancel")
class Cancel:
    """A client gives up one of its own requests."""

    request_id: str


@message("query")
class Query:
    """Health, Info or Stats; answered with the matching reply carrying `query_id`."""

    query_id: str
    kind: QueryKind


@message("load_adapter")
class LoadAdapter:
    """A client registers a LoRA adapter under `name` from the directory `path` (vLLM's
    /v1/load_lora_adapter): checked against the base model, then usable by requests; answered with
    AdapterReply."""

    query_id: str
    name: str
    path: str


@message("unload_adapter")
class UnloadAdapter:
    """A client removes the adapter `name` (refused while requests use it); answered with AdapterReply."""

    query_id: str
    name: str


@message("tokenize_query")
class TokenizeQuery:
    """A client asks how `inputs` tokenize (TGI's /tokenize), or `messages` through the chat
    template, or what text `ids` decode to (vLLM's /detokenize); answered with TokenizeReply."""

    query_id: str
    inputs: str
    add_special_tokens: bool = True
    truncate: int | None = None
    messages: list[ChatMessage] | None = None
    ids: list[int] | None = None


@message("encoded")
class Encoded:
    """A tokenizer's answer to an encode job: ids and resolved worker-side parameters.

    `tokenizer_id` is the identity of the tokenizer that keeps this request's decode state.
    """

    key: RequestKey
    input_ids: list[int]
    sampling: SamplingParameters
    max_new_tokens: int
    ignore_eos: bool
    top_n_tokens: int
    prefill_logprobs: bool
    tokenizer_id: bytes
    embed: bool = False  # the answer is the prompt's pooled hidden state (the one token is not the point)
    images: list[EncodedImage] = ()  # type: ignore[assignment]  # the prompt's images, in order

    def __post_init__(self) -> None:
        if isinstance(self.images, tuple):
            object.__setattr__(self, "images", list(self.images))


@message("rejected")
class Rejected:
    """A tokenizer refused a request (too long, bad template...): the client gets `error`."""

    key: RequestKey
    error: str
    error_type: str = "validation"


@record
class ClientOutput:
    """Encoded `StreamEvents` for one client."""

    client_id: bytes
    payload: bytes


@message("text_batch")
class TextBatch:
    """A tokenizer's output for one step: encoded StreamEvents per client, and stop hits.

    `payload` is an encoded `StreamEvents`, forwarded to the client without decoding.
    `finished` lists requests the tokenizer ended itself (stop sequence): the scheduler drops
    them from their batch at the next step. `job_id` is the DetokenizeJob's it answers: the
    answer of a job the scheduler no longer waits for (sent to a tokenizer it lost, then handed
    to another) is dropped, never streamed twice.
    """

    outputs: list[ClientOutput]
    finished: list[RequestKey]
    job_id: int = 0


@message("tokenize_done")
class TokenizeDone:
    """A tokenizer's answer to TokenizeJob: `payload` is an encoded TokenizeReply, forwarded
    to the asking client without decoding."""

    job_id: int
    payload: bytes


@message("step_result")
class StepResult:
    """A worker's answer to Prefill or Decode."""

    command_id: int
    generations: list[Generation]
    batch: CachedBatch | None
    timings: Timings


@message("filter_result")
class FilterResult:
    command_id: int
    batch: CachedBatch | None


@message("warmup_result")
class WarmupResult:
    """What the worker can hold: the largest batch token budget it supports. A paged worker
    (`num_blocks` > 0) also gives its KV pool, whose blocks the scheduler allocates, and the
    most tokens one step should carry to stay short on its hardware (`max_step_tokens`). When every
    layer of its model attends within a sliding window, `kv_window` is that window: a request's keys
    further back than it from its newest position are never read again."""

    command_id: int
    max_batch_total_tokens: int
    num_blocks: int = 0
    block_size: int = 0
    max_step_tokens: int = 0
    kv_window: int | None = None


@message("command_done")
class CommandDone:
    """Answer to Clear and Health."""

    command_id: int


@message("command_failed")
class CommandFailed:
    """A command failed inside the worker; `seq_ids` are the requests it takes down."""

    command_id: int
    error: str
    seq_ids: list[int]
