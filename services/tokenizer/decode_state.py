"""One request's detokenization state, kept by the tokenizer that encoded it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ztgi.common.messages import Encoded, GenerateParameters, Token, TopTokens
from ztgi.services.tokenizer.stop_sequences import StopSequences

NUM_CONTEXT_TOKENS = 5
"""Prompt tokens decoded before the first new one (TGI), so tokenizers that drop a leading
space at the start of a decode still give the first token its space."""

Decode = Callable[[list[int]], str]


@dataclasses.dataclass
class DecodeState:
    """TGI's incremental detokenization over the prompt's tail and the generated ids, plus
    what the final event needs: stop sequences, seed, prefill tokens, the text so far.

    `prefix_offset..read_offset` is the window already emitted; each new token decodes
    `ids[prefix_offset:]` and emits what it adds, unless that ends in half a character.
    """

    input_ids: list[int]
    stop_sequences: StopSequences
    seed: int | None
    top_n_tokens: int
    decoder_input_details: bool
    ids: list[int] = dataclasses.field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    num_generated_tokens: int = 0
    generated_parts: list[str] = dataclasses.field(default_factory=list)
    prefill: list[Token] = dataclasses.field(default_factory=list)
    prefill_top_tokens: list[TopTokens] = dataclasses.field(default_factory=list)
    cached_tokens: int = 0
    embedding: bytes | None = None  # an embedding request's vector, for its final event
    scheduler_nonce: str = ""  # the scheduler this request belongs to

    @classmethod
    def start(cls, encoded: Encoded, params: GenerateParameters, scheduler_nonce: str = "") -> DecodeState:
        """The state of a request that was just encoded."""
        context_ids = encoded.input_ids[-NUM_CONTEXT_TOKENS:]
        return cls(
            scheduler_nonce=scheduler_nonce,
            input_ids=encoded.input_ids,
            stop_sequences=StopSequences(params.stop),
            seed=encoded.sampling.seed if encoded.sampling.do_sample else None,
            top_n_tokens=encoded.top_n_tokens,
            decoder_input_details=params.decoder_input_details,
            ids=list(context_ids),
            prefix_offset=0,
            read_offset=len(context_ids),
        )

    def next_text(self, token_id: int, decode: Decode, flush: bool = False) -> str:
        """The text `token_id` adds: "" while the text ends in an incomplete character, then
        the whole character at once. `flush` (the last token) emits whatever is left."""
        self.ids.append(token_id)
        self.num_generated_tokens += 1
        prefix_text = decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and (flush or not new_text.endswith("\ufffd")):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new_text[len(prefix_text):]
        return ""

    def add_generated_text(self, text: str) -> None:
        self.generated_parts.append(text)

    @property
    def generated_text(self) -> str:
        return "".join(self.generated_parts)
