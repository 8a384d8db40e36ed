"""Anthropic's Messages request (`POST /v1/messages`) to the internal chat request.

The request is rewritten as the OpenAI chat request it means and parsed by the chat route's own
parser, so both APIs share one path to the pipeline: `system` becomes a system turn, `tool_use`
blocks an assistant's `tool_calls`, `tool_result` blocks `tool` turns, `tools[].input_schema`
function parameters, `tool_choice` any/tool OpenAI's required/named function. Earlier turns'
`thinking` blocks are left out of the prompt (as Anthropic does). An `image` block (its `source`
base64 data or a URL) is an `image_url` part of the user turn. A field or block this server
does not know, or does not implement, is refused (400), never ignored; `metadata` and
`cache_control` (of the request or of a block) are accepted: prefix caching needs no marks.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ztgi.common.parameters import ParameterLimits, ValidationError, validate_parameters
from ztgi.services.gateway.openai_schemas import OpenAIRequest, parse_chat_request
from ztgi.services.gateway.schemas import json_type, optional_integer

MESSAGES_FIELDS = frozenset({"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
                             "top_k", "stream", "tools", "tool_choice", "metadata", "cache_control"})
COUNT_TOKENS_FIELDS = frozenset({"model", "messages", "system"})
UNSUPPORTED_FIELDS = {"thinking": " (with --reasoning-parser a reasoning model's thinking comes back as a "
                                  "thinking block, without a budget)",
                      "output_config": "", "container": "", "mcp_servers": "", "service_tier": "",
                      "context_management": "", "speed": "", "inference_geo": ""}
"""Anthropic fields this server knows and does not implement: refused, with what to do instead."""
_UNSUPPORTED_BLOCKS = frozenset({"document", "search_result", "server_tool_use", "web_search_tool_result",
                                 "container_upload"})
_USER_BLOCKS = frozenset({"text", "image", "tool_result"})
_ASSISTANT_BLOCKS = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})
_BLOCK_FIELDS = {"text": {"text", "citations"}, "image": {"source"},
                 "tool_result": {"tool_use_id", "content", "is_error"}, "tool_use": {"id", "name", "input"},
                 "thinking": {"thinking", "signature"},
                 "redacted_thinking": {"data"}}


@dataclasses.dataclass(frozen=True)
class MessagesRequest:
    """A Messages request: the chat it means, and what the answer must say of its stop sequences."""

    chat: OpenAIRequest
    stop_sequences: list[str]


def parse_messages_request(body: Any, limits: ParameterLimits, max_client_batch_size: int) -> MessagesRequest:
    """POST /v1/messages; ValidationError (Anthropic's 400) naming the field for anything refused."""
    body = _checked_body(body, MESSAGES_FIELDS)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise ValidationError("max_tokens", "missing field `max_tokens`")
    stop_sequences = _stop_sequences(body.get("stop_sequences"))
    chat_body: dict[str, Any] = {"model": body["model"], "messages": _chat_messages(body), "max_tokens": max_tokens,
                                 "temperature": body.get("temperature"), "top_p": body.get("top_p"),
                                 "stream": body.get("stream"), "stop": stop_sequences or None}
    chat_body.update(_tool_fields(body))
    chat = parse_chat_request(chat_body, limits, max_client_batch_size)
    top_k = optional_integer(body, "top_k")
    if top_k is not None:
        parameters = dataclasses.replace(chat.parameters, top_k=top_k)
        validate_parameters(parameters, limits)
        chat = dataclasses.replace(chat, parameters=parameters)
    return MessagesRequest(chat, stop_sequences)


def parse_count_tokens_request(body: Any) -> OpenAIRequest:
    """POST /v1/messages/count_tokens: the chat whose prompt is counted (`tools` are refused: the
    count would leave out their rendering in the template)."""
    body = _checked_body(body, COUNT_TOKENS_FIELDS, "is not taken by count_tokens on this server (it counts "
                                                    "`system` and `messages`, not the tools' rendering)")
    chat_body = {"messages": _chat_messages(body), "max_tokens": 1}
    return parse_chat_request(chat_body, ParameterLimits(), 1)


def _checked_body(body: Any, fields: frozenset[str], refused: str = "") -> dict:
    if not isinstance(body, dict):
        raise ValidationError("body", "the request body must be a JSON object")
    for name in body:
        if name in UNSUPPORTED_FIELDS:
            raise ValidationError(name, f"`{name}` is not supported by this server{UNSUPPORTED_FIELDS[name]}")
        if name not in fields:
            raise ValidationError(name, f"`{name}` {refused}" if name in MESSAGES_FIELDS
                                  else f"`{name}`: unknown field")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ValidationError("model", "`model` must be a non-empty string")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise ValidationError("metadata", f"`metadata` must be an object, got {json_type(body['metadata'])}")
    return body


def _stop_sequences(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, str) and item for item in raw):
        raise ValidationError("stop_sequences", "`stop_sequences` must be an array of non-empty strings")
    return raw


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI turns of `system` and `messages`."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ValidationError("messages", "`messages` must be a non-empty array of messages")
    turns = [] if body.get("system") is None else [{"role": "system", "content": _system(body["system"])}]
    for index, message in enumerate(raw):
        turns += _turns(message, index)
    return turns


def _system(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return "".join(_block_text(block, f"system[{i}]", "system") for i, block in enumerate(raw))
    raise ValidationError("system", f"`system` must be a string or an array of text blocks, got {json_type(raw)}")


def _turns(message: Any, index: int) -> list[dict[str, Any]]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValidationError("messages", f"`{where}` must be an object, got {json_type(message)}")
    unknown = set(message) - {"role", "content"}
    if unknown:
        raise ValidationError("messages", f"`{where}.{sorted(unknown)[0]}`: unknown field")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise ValidationError("messages", f"`{where}.role` must be \"user\" or \"assistant\" (a system prompt "
                                          f"goes in `system`). Given: {json.dumps(role)}")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ValidationError("messages", f"`{where}.content` must be a string or an array of content blocks")
    blocks = [_block(block, f"{where}.content[{i}]", role) for i, block in enumerate(content)]
    return _user_turns(blocks) if role == "user" else [_assistant_turn(blocks)]


def _block(block: Any, where: str, role: str) -> dict[str, Any]:
    """A content block, checked: its type allowed in this role, its fields known."""
    if not isinstance(block, dict):
        raise ValidationError("messages", f"`{where}` must be a content block (an object), got {json_type(block)}")
    kind = block.get("type")
    if kind in _UNSUPPORTED_BLOCKS:
        raise ValidationError("messages", f"`{where}`: {kind} blocks are not supported by this server")
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    if kind not in allowed:
        raise ValidationError("messages", f"`{where}.type` must be one of {', '.join(sorted(allowed))} in a {role} "
                                          f"turn. Given: {json.dumps(kind)}")
    unknown = set(block) - _BLOCK_FIELDS[kind] - {"type", "cache_control"}
    if unknown:
        raise ValidationError("messages", f"`{where}.{sorted(unknown)[0]}`: unknown field of a {kind} block")
    if kind == "text":
        _block_text(block, where, "messages")
    return block


def _block_text(block: Any, where: str, field: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise ValidationError(field, f"`{where}` must be a text block ({{\"type\": \"text\", \"text\": ...}})")
    return block["text"]


def _user_turns(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results become `tool` turns; the text and images around them one user turn (its content
    OpenAI's parts when it has an image)."""
    turns = [{"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": _tool_result(block)}
             for block in blocks if block["type"] == "tool_result"]
    texts = [block["text"] for block in blocks if block["type"] == "text"]
    if any(block["type"] == "image" for block in blocks):
        parts = [_chat_part(block) for block in blocks if block["type"] != "tool_result"]
        turns.append({"role": "user", "content": parts})
    elif texts or not turns:
        turns.append({"role": "user", "content": "".join(texts)})
    return turns


def _chat_part(block: dict[str, Any]) -> dict[str, Any]:
    """A text or image block as OpenAI's content part; an image's `source` is base64 data (as a
    data: URL) or a URL."""
    if block["type"] == "text":
        return {"type": "text", "text": block["text"]}
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("media_type"), str) and isinstance(source.get("data"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{source['media_type']};base64,{source['data']}"}}
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise ValidationError("messages", "an image block's `source` must be {\"type\": \"base64\", \"media_type\": "
                                      "\"image/png\", \"data\": ...} or {\"type\": \"url\", \"url\": ...}")


def _tool_result(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(_block_text(part, "tool_result.content", "messages") for part in content)
    if not isinstance(content, str) or not isinstance(block.get("tool_use_id"), str):
        raise ValidationError("messages", "a tool_result block needs `tool_use_id` (a string) and `content` "
                                          "(a string or text blocks)")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise ValidationError("messages", "a tool_result block's `is_error` must be a boolean")
    return f"Error: {content}" if is_error else content


def _assistant_turn(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    calls = []
    for block in blocks:
        if block["type"] != "tool_use":
            continue
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or \
                not isinstance(block.get("input"), dict):
            raise ValidationError("messages", "a tool_use block needs `id` and `name` (strings) and `input` "
                                              "(an object)")
        calls.append({"id": block["id"], "type": "function",
                      "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
    text = "".join(block["text"] for block in blocks if block["type"] == "text")
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def _tool_fields(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` of Anthropic's `tools` and `tool_choice`."""
    fields: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ValidationError("tools", "`tools` must be an array of tools")
        fields["tools"] = [_tool(tool, index) for index, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        fields["tool_choice"], parallel = _tool_choice(choice)
        fields["parallel_tool_calls"] = parallel
    return fields


def _tool(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        raise ValidationError("tools", f"`{where}` must be a custom tool ({{\"name\", \"description\", "
                                       f"\"input_schema\"}}); server tools are not supported by this server")
    unknown = set(tool) - {"type", "name", "description", "input_schema", "cache_control"}
    if unknown:
        raise ValidationError("tools", f"`{where}.{sorted(unknown)[0]}`: unknown field")
    if not isinstance(tool.get("input_schema"), dict):
        raise ValidationError("tools", f"`{where}.input_schema` must be a JSON Schema object")
    function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(raw: Any) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel_tool_calls)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none") or set(raw) - {"type", "name", "disable_parallel_tool_use"}:
        raise ValidationError("tool_choice", "`tool_choice` must be {\"type\": \"auto\" | \"any\" | \"none\"} or "
                                             "{\"type\": \"tool\", \"name\": ...}")
    parallel = raw.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise ValidationError("tool_choice", "`tool_choice.disable_parallel_tool_use` must be a boolean")
    if kind == "tool":
        return {"type": "function", "function": {"name": raw.get("name")}}, not parallel
    return {"any": "required"}.get(kind, kind), not parallel
