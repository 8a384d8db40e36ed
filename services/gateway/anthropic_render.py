"""Anthropic's Messages answer: the message object, its content blocks, stop reason and usage.

An answer is a `thinking` block (with `--reasoning-parser`, when the model reasoned), then either
`tool_use` blocks (an answer of tool calls) or one `text` block. Thinking blocks carry an empty
`signature`: this server does not sign them, and does not check the ones a client sends back.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ztgi.common.client.generate_result import GenerateResult
from ztgi.common.messages import FinalDetails
from ztgi.common.tool_calls import parse_calls
from ztgi.services.gateway.reasoning_parser import ReasoningSplit, split_reasoning
from ztgi.services.gateway.stop_trim import trim_stop

_STOP_REASONS = {"eos_token": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence"}


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(details: FinalDetails | None, called: bool) -> str | None:
    """end_turn, max_tokens or stop_sequence; tool_use for an answer of calls that ended by itself."""
    if details is None:
        return None
    reason = _STOP_REASONS.get(details.finish_reason, details.finish_reason)
    return "tool_use" if called and reason == "end_turn" else reason


def matched_stop_sequence(text: str, details: FinalDetails | None, stop_sequences: list[str]) -> str | None:
    """The stop sequence the answer ended on (the pipeline's text ends right after it)."""
    if details is None or details.finish_reason != "stop_sequence":
        return None
    ends = [sequence for sequence in stop_sequences if text.endswith(sequence)]
    return max(ends, key=len) if ends else None


def message_json(message_id: str, model: str, content: list[dict[str, Any]], reason: str | None,
                 stop_sequence: str | None, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "content": content, "model": model,
            "stop_reason": reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def thinking_block(thinking: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(tool_use_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}


def answer_json(message_id: str, model: str, result: GenerateResult, stop_sequences: list[str],
                opened: bool | None, tools: bool) -> dict[str, Any]:
    """The whole answer: `opened` as for `ReasoningStream` (None: no reasoning parser)."""
    details = result.details
    stop_sequence = matched_stop_sequence(result.text, details, stop_sequences)
    text = trim_stop(result.text, stop_sequences, stop_sequence is not None)
    split = ReasoningSplit(content=text) if opened is None else split_reasoning(text, opened)
    calls = parse_calls(split.content, truncated=details is not None and details.finish_reason == "length") \
        if tools else None
    content = [thinking_block(split.reasoning)] if split.reasoning else []
    if calls:
        content += [tool_use_block(new_tool_use_id(), name, json.loads(arguments)) for name, arguments in calls]
    elif split.content or not content:
        content.append(text_block(split.content))
    return message_json(message_id, model, content, stop_reason(details, bool(calls)), stop_sequence,
                        details.input_tokens if details is not None else 0,
                        details.generated_tokens if details is not None else 0)
