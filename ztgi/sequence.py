"""One generated sequence of an offline request, built from the tokenizer's stream events."""

from __future__ import annotations

from ztgi.common.messages import Encoded, GenerateParameters, RequestKey, StreamEvent, Token
from ztgi.outputs import (
    FINISH_REASONS,
    CompletionOutput,
    Logprob,
    PromptLogprobs,
    SampleLogprobs,
)
from ztgi.sampling_params import SamplingParams
from ztgi.services.gateway.stop_trim import trim_stop


class Sequence:
    """Sequence `index` of prompt `prompt_index`: the engine request's tokens, logprobs and, once
    its final event came, its text and finish reason (the detokenizer's, as a client gets them)."""


    def __init__(self, prompt_index: int, index: int, key: RequestKey, params: SamplingParams,
                 encoded: Encoded, parameters: GenerateParameters) -> None:
        self.prompt_index = prompt_index
        self.index = index
        self.key = key
        self.params = params
        self.encoded = encoded  # what the engine runs
        self.parameters = parameters  # what the detokenizer needs (stop strings, details)
        self.token_ids: list[int] = []
        self.logprobs: SampleLogprobs | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: PromptLogprobs | None = None
        self.text: str | None = None
        self.finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.text is not None

    def add(self, event: StreamEvent) -> None:
        """One token's event; the final one carries the text and the finish reason."""
        if event.error is not None:
            raise RuntimeError(f"prompt {self.prompt_index}: {event.error}")
        assert event.token is not None
        self.token_ids.append(event.token.id)
        if self.logprobs is not None:
            self.logprobs.append(_step_logprobs(event.token, event.top_tokens))
        if event.details is not None:
            self.text = event.generated_text or ""
            self.finish_reason = event.details.finish_reason
            if self.params.prompt_logprobs is not None:
                self.prompt_logprobs = [None if t.logprob is None else {t.id: Logprob(t.logprob, None, t.text)}
                                        for t in event.details.prefill]

    def to_output(self) -> CompletionOutput:
        assert self.text is not None and self.finish_reason is not None
        stop_reason = self._stop_string()
        text = self.text
        if stop_reason is not None and not self.params.include_stop_str_in_output:
            text = trim_stop(text, [stop_reason], stopped=True)
        cumulative = None
        if self.logprobs is not None:
            cumulative = sum(step[token_id].logprob for step, token_id in zip(self.logprobs, self.token_ids))
        return CompletionOutput(self.index, text, list(self.token_ids), cumulative, self.logprobs,
                                FINISH_REASONS.get(self.finish_reason, self.finish_reason), stop_reason)

    def _stop_string(self) -> str | None:
        """The stop string the text ends on (the longest, as the gateway trims), when one ended it."""
        if self.finish_reason != "stop_sequence" or self.text is None:
            return None
        ends = [s for s in self.params.stop_strings if self.text.endswith(s)]
        return max(ends, key=len) if ends else None


def _step_logprobs(token: Token, top_tokens: list[Token]) -> dict[int, Logprob]:
    """The chosen token and the step's top tokens (best first), as vLLM lists them."""
    ranks = {top.id: rank for rank, top in enumerate(top_tokens, start=1)}
    step = {token.id: Logprob(_sampled(token.logprob), ranks.get(token.id), token.text)}
    for top in top_tokens:
        step.setdefault(top.id, Logprob(_sampled(top.logprob), ranks[top.id], top.text))
    return step


def _sampled(logprob: float | None) -> float:
    """A generated or top token's logprob: only prompt tokens may come without one."""
    assert logprob is not None, "a generated token without a logprob"
    return logprob
