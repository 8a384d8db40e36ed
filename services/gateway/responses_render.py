"""The Responses API's answer: the `response` object, its output items and its usage, as the
openai SDK's `openai.types.responses.Response` reads them.

An answer that ran into `max_output_tokens` is `incomplete` (its last item too), with
`incomplete_details.reason` `max_output_tokens`; an answer of tool calls is `function_call`
items, each with its `call_id`, else one assistant `message` with one `output_text` part.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from ztgi.common.messages import FinalDetails
from ztgi.common.tool_calls import parse_calls
from ztgi.services.gateway.tool_stream import new_call_id

Item = dict[str, Any]


def new_item_id(prefix: str) -> str:
    """`resp`, `msg` or `fc` followed by a fresh random id, as OpenAI's."""
    return f"{prefix}_{uuid.uuid4().hex}"


def truncated(details: FinalDetails | None) -> bool:
    """Whether the answer ended on the token limit."""
    return details is not None and details.finish_reason == "length"


@dataclasses.dataclass(frozen=True)
class ResponseFrame:
    """What every rendering of one response shares: its id, creation time, model and the
    request's parameters it repeats."""

    response_id: str
    created_at: int
    model: str
    echoed: dict[str, Any]

    def response_json(self, output: list[Item], details: FinalDetails | None, status: str | None = None,
                      error: dict[str, str] | None = None) -> dict[str, Any]:
        """The response object with these output items: finished (status from `details`), or in
        the `status` given (`in_progress`, `failed` with its `error`)."""
        status = status or ("incomplete" if truncated(details) else "completed")
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": status, "error": error,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "model": self.model, "output": output, "usage": usage_json(details), **self.echoed}


def message_item(item_id: str, text: str, status: str) -> Item:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": [text_part(text)] if status != "in_progress" else []}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(text: str, details: FinalDetails | None, tools: bool) -> list[Item]:
    """A whole answer's items: its calls (those it finished, when cut short) or one message."""
    status = "incomplete" if truncated(details) else "completed"
    calls = parse_calls(text, truncated=truncated(details)) if tools else None
    if calls:
        return [function_call_item(new_item_id("fc"), new_call_id(), name, arguments, "completed")
                for name, arguments in calls]
    return [message_item(new_item_id("msg"), text, status)]


def error_json(message: str, error_type: str) -> dict[str, str]:
    """A failed response's `error`: OpenAI's code for the kind of failure, the pipeline's message."""
    return {"code": "rate_limit_exceeded" if error_type == "overloaded" else "server_error", "message": message}


def usage_json(details: FinalDetails | None) -> dict[str, Any] | None:
    if details is None:
        return None
    return {"input_tokens": details.input_tokens, "output_tokens": details.generated_tokens,
            "total_tokens": details.input_tokens + details.generated_tokens,
            "input_tokens_details": {"cached_tokens": details.cached_tokens, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}
