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
class RequestOutput:
    """One prompt's result: its ids and its `n` sequences, in `index` order."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: PromptLogprobs | None
    outputs: list[CompletionOutput]
    finished: bool = True

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(output.token_ids) for output in self.outputs)
