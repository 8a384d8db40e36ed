"""vLLM's /tokenize and /detokenize request forms, served beside TGI's /tokenize.

`{"model", "prompt"}` or `{"model", "messages"}` (the chat template's prompt) answer
`{"count", "max_model_len", "tokens", "token_strs"}`; `/detokenize` `{"model", "tokens"}`
answers `{"prompt"}`. `token_strs` (with `return_token_strs`) are each token's text in the
prompt, as TGI's /tokenize gives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ztgi.common.messages import ChatMessage
from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.json_values import json_type
from ztgi.services.gateway.openai_schemas import parse_messages
from ztgi.services.gateway.schemas import optional_value

_MAX_TOKEN_ID = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class TokenizeRequest:
    """A text `prompt` or chat `messages` (exactly one), and what to add and return."""

    prompt: str | None
    messages: list[ChatMessage] | None
    add_special_tokens: bool
    return_token_strs: bool


def is_vllm_tokenize(body: Any) -> bool:
    """vLLM's form: `prompt` or `messages` where TGI's has `inputs`."""
    return isinstance(body, dict) and "inputs" not in body and ("prompt" in body or "messages" in body)


def parse_tokenize_request(body: dict[str, Any]) -> TokenizeRequest:
    if ("prompt" in body) == ("messages" in body):
        raise ValidationError("prompt", "send exactly one of `prompt` and `messages`")
    return_token_strs = optional_value(body, "return_token_strs", bool, "a boolean") or False
    if "messages" in body:
        # the template writes its special tokens: vLLM adds none by default for a chat
        add_special_tokens = optional_value(body, "add_special_tokens", bool, "a boolean") or False
        return TokenizeRequest(None, parse_messages(body["messages"]), add_special_tokens, return_token_strs)
    prompt = body["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise ValidationError("prompt", f"`prompt` must be a non-empty string, got {json_type(prompt)}")
    add_special_tokens = optional_value(body, "add_special_tokens", bool, "a boolean")
    return TokenizeRequest(prompt, None, True if add_special_tokens is None else add_special_tokens,
                           return_token_strs)


def parse_detokenize_request(body: Any) -> list[int]:
    """`{"tokens": [id, ...]}`: the ids (checked against the vocabulary by the tokenizer)."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not tokens or \
            not all(type(t) is int and 0 <= t <= _MAX_TOKEN_ID for t in tokens):
        raise ValidationError("tokens", "`tokens` must be a non-empty array of token ids (integers >= 0)")
    return tokens
