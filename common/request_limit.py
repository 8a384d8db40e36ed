"""Every limit on one request, declared once: its name, default, unit and meaning.

Each service config that checks a limit (gateway, tokenizer, scheduler, the launcher that passes
it on) and `ParameterLimits` take that field from here with `LIMIT.field()`, so the flag
`--max-x`, the variable `ZTGI_MAX_X` and their default cannot drift apart between services.
docs/limits.md says where each one is enforced and why there.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RequestLimit:
    """One limit: the config field's name, its default, and its help (the meaning, with its unit)."""

    name: str
    default: int
    help: str

    def field(self) -> Any:
        """A dataclass field with this default and help; its metadata names this declaration."""
        return dataclasses.field(default=self.default, metadata={"help": self.help, "limit": self})


MAX_INPUT_TOKENS = RequestLimit(
    "max_input_tokens", 4095,
    "tokens a prompt may have after `truncate`; also the largest `truncate`")
MAX_TOTAL_TOKENS = RequestLimit(
    "max_total_tokens", 4096,
    "prompt tokens plus `max_new_tokens`, per request; an unset `max_new_tokens` is what is left")
MAX_STOP_SEQUENCES = RequestLimit(
    "max_stop_sequences", 4, "`stop` strings one request may give")
MAX_TOP_N_TOKENS = RequestLimit(
    "max_top_n_tokens", 5, "alternatives per token one request may ask for (`top_n_tokens`, `top_logprobs`)")
MAX_BEST_OF = RequestLimit(
    "max_best_of", 2, "sequences one request may ask `best_of` to generate (1: `best_of` refused)")
MAX_CONCURRENT_REQUESTS = RequestLimit(
    "max_concurrent_requests", 128,
    "requests the scheduler holds at once, queued or running; one more is answered 429")
MAX_CLIENT_BATCH_SIZE = RequestLimit(
    "max_client_batch_size", 4, "prompts times `n` choices in one OpenAI request")
MAX_PAYLOAD_BYTES = RequestLimit(
    "max_payload_bytes", 2 * 1024 * 1024, "bytes of one request body; a larger body is answered 413")
MAX_IMAGE_PIXELS = RequestLimit(
    "max_image_pixels", 4096 * 4096,
    "pixels (width x height) one image of a vision-language model's request may have, checked on the file's "
    "header before it is decoded")

REQUEST_LIMITS = (MAX_INPUT_TOKENS, MAX_TOTAL_TOKENS, MAX_STOP_SEQUENCES, MAX_TOP_N_TOKENS, MAX_BEST_OF,
                  MAX_CONCURRENT_REQUESTS, MAX_CLIENT_BATCH_SIZE, MAX_PAYLOAD_BYTES, MAX_IMAGE_PIXELS)
