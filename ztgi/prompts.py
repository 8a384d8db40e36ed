"""What `LLM.generate` and `LLM.chat` accept, checked and put in one shape before any work starts."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

from ztgi.common.messages import ChatMessage
from ztgi.sampling_params import SamplingParams


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: text, token ids, or a conversation (exactly one of them)."""

    text: str | None = None
    token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None


def as_prompts(prompts: Any) -> list[Prompt]:
    """One prompt or many: strings, token-id lists, or vLLM's dicts (`prompt` / `prompt_token_ids`).
    A flat list of ints is one prompt of token ids."""
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a string, token ids, or a list of them, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts must not be empty: give at least one prompt")
    return [_as_prompt(index, prompt) for index, prompt in enumerate(prompts)]


def as_conversations(messages: Any) -> list[Prompt]:
    """One conversation (a list of {role, content} dicts) or a list of them."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts, or a list of such lists")
    conversations = [messages] if isinstance(messages[0], dict) else messages
    return [Prompt(messages=_conversation(index, conversation)) for index, conversation in enumerate(conversations)]


def per_prompt(sampling_params: SamplingParams | Sequence[SamplingParams] | None,
               num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams for every prompt, or one each (vLLM's rule)."""
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else None
    if params is None or not all(isinstance(p, SamplingParams) for p in params):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got {sampling_params!r}")
    if len(params) != num_prompts:
        raise ValueError(f"got {len(params)} SamplingParams for {num_prompts} prompts: give one, or one per prompt")
    return params


def _as_prompt(index: int, prompt: Any) -> Prompt:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            prompt = prompt["prompt"]
    if isinstance(prompt, str):
        return Prompt(text=prompt)
    if _is_token_ids(prompt) and prompt:
        return Prompt(token_ids=[int(token_id) for token_id in prompt])
    raise ValueError(f"prompt {index} must be a non-empty string, a non-empty list of token ids, or a dict with "
                     f"'prompt' or 'prompt_token_ids'; got {prompt!r:.80}")


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value) and len(value) > 0


def _conversation(index: int, conversation: Any) -> list[ChatMessage]:
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise ValueError(f"conversation {index} must be a non-empty list of {{'role', 'content'}} dicts")
    return [_chat_message(index, message) for message in conversation]


def _chat_message(index: int, message: Any) -> ChatMessage:
    """`content` is a string or OpenAI's list of text parts (joined, as the gateway flattens them)."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"conversation {index}: each message must be a dict with a string 'role', got {message!r:.80}")
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        content = "".join(str(part.get("text", "")) for part in content)
    if not isinstance(content, str):
        raise ValueError(f"conversation {index}: 'content' must be a string or a list of text parts, "
                         f"got {content!r:.80}")
    return ChatMessage(message["role"], content)
