"""OpenAI's legacy `logprobs` object of /v1/completions, built token by token.

The shape: `{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}, ...] or
null, "text_offset": [...]}`, one entry per generated token (as `usage` counts them). A token's
offset is where its text starts in the choice's text: the echoed prompt comes first, and a
special token (EOS) adds no text. As in vLLM, the tokens that made up a stop sequence keep their
entries although the text leaves the sequence out.

With `echo` the prompt's tokens come first, as vLLM answers (what lm-evaluation-harness reads):
the first one's logprob and alternatives are null (nothing predicts it), and the choice's text
begins with the prompt.
"""

from __future__ import annotations

import math
from typing import Any

from ztgi.common.messages import Token


def logprob_json(token: Token) -> float:
    """A logprob JSON can carry (the pipeline may report none, or -inf for a filtered token)."""
    return token.logprob if token.logprob is not None and math.isfinite(token.logprob) else -9999.0


class CompletionLogprobs:
    """One choice's entries; `render` is called once for a whole text, or once per streamed chunk."""

    def __init__(self, num_top_logprobs: int, text_offset: int = 0) -> None:
        self.num_top_logprobs = num_top_logprobs
        self.text_offset = text_offset

    def render(self, tokens: list[Token], top_tokens: list[list[Token]]) -> dict[str, Any]:
        """The entries of the choice's next `tokens`; later calls continue the offsets."""
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += 0 if token.special else len(token.text)
        return {"tokens": [token.text for token in tokens],
                "token_logprobs": [logprob_json(token) for token in tokens],
                "top_logprobs": self._top_logprobs(top_tokens, len(tokens)),
                "text_offset": offsets}

    def render_prompt(self, prefill: list[Token], prefill_top: list[list[Token]]) -> dict[str, Any]:
        """The entries of the prompt's tokens (`FinalDetails.prefill`), offsets from the start."""
        rendered = self.render(prefill, prefill_top)
        rendered["token_logprobs"][:1] = [None] * min(1, len(prefill))
        if rendered["top_logprobs"] is not None and prefill:
            rendered["top_logprobs"][0] = None
        return rendered

    @staticmethod
    def concatenate(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
        """The entries of `first` then `second` (the prompt's, then the generated tokens')."""
        return {name: None if first[name] is None or second[name] is None else first[name] + second[name]
                for name in first}

    def _top_logprobs(self, top_tokens: list[list[Token]], num_tokens: int) -> list[dict[str, float]] | None:
        """The N likeliest alternatives at each position (null when N is 0, as OpenAI)."""
        if not self.num_top_logprobs:
            return None
        top_tokens = top_tokens or [[] for _ in range(num_tokens)]
        return [{t.text: logprob_json(t) for t in top[:self.num_top_logprobs]} for top in top_tokens]
