"""What `LLM.generate` returns: vLLM's `RequestOutput` and `CompletionOutput`, field for field."""

from __future__ import annotations

import dataclasses

FINISH_REASONS = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
"""The pipeline's finish reasons (TGI's) as vLLM names them."""


@dataclasses.dataclass
class Logprob:
    """One token's logprob; `rank` is its place among the step's top tokens (1: the likeliest),
    None when it was not among the `logprobs` asked for."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
"""Per generated token: the chosen token and the step's top tokens, by id."""

PromptLogprobs = list[dict[int, Logprob] | None]
"""Per prompt token: its own logprob (None for the first: nothing predicts it)."""


@dataclasses.dataclass
class CompletionOutput:
    """One generated sequence of a prompt (`index` among its `n`).

    `finish_reason` is "stop" (an end-of-sequence token or a stop string) or "length";
    `stop_reason` is the stop string that ended it, None otherwise.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    """When a request's events happened (vLLM's `RequestOutput.metrics`), in seconds on
    `time.monotonic()`'s clock: `arrival_time` when it entered the engine's queue, `token_times` when
    each token of its first sequence (`outputs[0]`) came out of the engine's step, `finished_time`
    when its last sequence ended. What a benchmark of the engine in process needs for TTFT and
    inter-token latencies without a server."""

    arrival_time: float
    token_times: list[float] = dataclasses.field(default_factory=list)
    finished_time: float | None = None

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def last_token_time(self) -> float | None:
        return self.token_times[-1] if self.token_times else None


@dataclasses.dataclass
class RequestOutput:
    """One prompt's result: its ids, its `n` sequences in `index` order, and its timings."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: RequestMetrics | None = None

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(output.token_ids) for output in self.outputs)


@dataclasses.dataclass
class EmbeddingOutput:
    """One prompt's embedding: the pooled final hidden state, L2-normalised (vLLM's)."""

    embedding: list[float]


@dataclasses.dataclass
class EmbeddingRequestOutput:
    """One prompt's result of `LLM.embed` (vLLM's shape)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True
