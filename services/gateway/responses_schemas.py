"""POST /v1/responses: a Responses API request, checked, as the chat completion it runs as.

The request becomes a chat completion body (`instructions` and `input` as messages,
`max_output_tokens` as `max_completion_tokens`, `text.format` as `response_format`, function
`tools` in chat's shape) and goes through the chat parser, so the chat template, the grammar of
structured output and tool calls, and every parameter check are chat's own. What is particular
to Responses is checked here first, so its errors name the Responses fields. Fields this server
does not implement are refused (422), never silently ignored; a field that only states what
this server does anyway (`truncation: "disabled"`, `background: false`) is accepted.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.services.gateway.json_values import json_type
from ztgi.services.gateway.openai_schemas import OpenAIRequest, parse_chat_request
from ztgi.services.gateway.responses_input import chat_messages
from ztgi.services.gateway.schemas import optional_integer, optional_value
from ztgi.services.gateway.structured_output import TOOL_NAME

_FIELDS = frozenset({"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "seed", "text",
                     "tools", "tool_choice", "parallel_tool_calls", "metadata", "user", "store", "stream",
                     "previous_response_id", "safety_identifier", "prompt_cache_key"})
"""Fields served (`seed` is chat's, an extension here; the last two are labels, not instructions)."""
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {"truncation": ("disabled",), "background": (False,),
                                              "service_tier": ("auto", "default"), "include": ([],)}
_UNSUPPORTED_FIELDS = ("conversation", "prompt", "reasoning", "top_logprobs", "stream_options", "max_tool_calls",
                       "prompt_cache_retention", "prompt_cache_options", "context_management", "image",
                       "moderation", "access_programs", "background_options")
_TOOL_FIELDS = frozenset({"type", "name", "description", "parameters", "strict"})
_FORMAT_TYPES = ("text", "json_object", "json_schema")
_MAX_METADATA_KEYS, _MAX_METADATA_KEY, _MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits


@dataclasses.dataclass(frozen=True)
class ResponsesRequest:
    """The chat completion a Responses request runs as, and what its Response object echoes."""

    chat: OpenAIRequest
    echoed: dict[str, Any]  # the request's parameters as the Response object repeats them
    turns: list[dict[str, Any]]  # the conversation so far as chat messages, without the instructions
    store: bool = False


def parse_responses_request(body: Any, limits: ParameterLimits,
                            history: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    """POST /v1/responses; `history` is the conversation `previous_response_id` continues (its
    instructions are not carried over, as OpenAI: this request's replace them)."""
    if not isinstance(body, dict):
        raise ValidationError("body", "the request body must be a JSON object")
    _refuse_unserved_fields(body)
    instructions = optional_value(body, "instructions", str, "a string")
    max_output_tokens = optional_integer(body, "max_output_tokens")
    if max_output_tokens is not None and max_output_tokens <= 0:
        raise ValidationError("max_output_tokens", f"`max_output_tokens` must be strictly positive. "
                                                   f"Given: {max_output_tokens}")
    optional_value(body, "parallel_tool_calls", bool, "a boolean")
    text_format, tools = _text_format(body.get("text")), _tools(body.get("tools"))
    turns = [*(history or []), *chat_messages(body.get("input"), None)]
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat_body = {"messages": [*system, *turns], "max_completion_tokens": max_output_tokens,
                 "response_format": _response_format(text_format),
                 "tools": [_chat_tool(tool) for tool in tools] if tools else None,
                 "tool_choice": _chat_tool_choice(body.get("tool_choice")),
                 **{name: body.get(name) for name in ("model", "temperature", "top_p", "seed", "stream",
                                                       "parallel_tool_calls")}}
    chat = parse_chat_request({k: v for k, v in chat_body.items() if v is not None}, limits)
    store = optional_value(body, "store", bool, "a boolean") or False
    return ResponsesRequest(chat, _echoed(body, text_format, tools, store), turns, store)


def _echoed(body: dict[str, Any], text_format: dict[str, Any], tools: list[dict[str, Any]],
            store: bool) -> dict[str, Any]:
    """The request's parameters, checked, as the Response object repeats them (OpenAI's defaults
    where not given)."""
    return {"instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": _metadata(body.get("metadata")),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "text": {"format": text_format}, "tool_choice": body.get("tool_choice", "auto"), "tools": tools,
            "user": optional_value(body, "user", str, "a string"), "store": store,
            "previous_response_id": optional_value(body, "previous_response_id", str, "a string"),
            "truncation": "disabled", "background": False}


def _refuse_unserved_fields(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name in _FIELDS or value is None or _is_no_op(name, value):
            continue
        if name in _NO_OP_VALUES:
            allowed = ", ".join(json.dumps(v) for v in _NO_OP_VALUES[name])
            raise ValidationError(name, f"`{name}` other than {allowed} is not supported by this server")
        if name in _UNSUPPORTED_FIELDS:
            raise ValidationError(name, f"`{name}` is not supported by this server")
        raise ValidationError(name, f"unknown field `{name}`: not a field of the Responses API this server serves")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValidationError("model", f"`model` must be a string, got {json_type(model)}")
    for name in ("safety_identifier", "prompt_cache_key"):
        optional_value(body, name, str, "a string")


def _is_no_op(name: str, value: Any) -> bool:
    """Whether `value` of `name` asks for what this server does anyway (a JSON 0 is not false)."""
    return any(type(value) is type(no_op) and value == no_op for no_op in _NO_OP_VALUES.get(name, ()))


def _text_format(raw: Any) -> dict[str, Any]:
    """`text.format`: {"type": "text" | "json_object"} or {"type": "json_schema", "name", "schema", ...}."""
    if raw is None:
        return {"type": "text"}
    if not isinstance(raw, dict):
        raise ValidationError("text", f"`text` must be an object, got {json_type(raw)}")
    if raw.get("verbosity") is not None:
        raise ValidationError("text", "`text.verbosity` is not supported by this server")
    unknown = sorted(set(raw) - {"format", "verbosity"})
    if unknown:
        raise ValidationError("text", f"unknown field `text.{unknown[0]}`")
    format_ = raw.get("format") or {"type": "text"}
    if not isinstance(format_, dict) or format_.get("type") not in _FORMAT_TYPES:
        raise ValidationError("text", f"`text.format.type` must be one of {', '.join(_FORMAT_TYPES)}")
    if format_["type"] != "json_schema":
        return {"type": format_["type"]}
    name, schema, strict = format_.get("name"), format_.get("schema"), format_.get("strict")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValidationError("text", "`text.format.name` must be 1 to 64 letters, digits, _ or -")
    if not isinstance(schema, dict):
        raise ValidationError("text", f"`text.format.schema` must be a JSON Schema object, got {json_type(schema)}")
    if strict is not None and not isinstance(strict, bool):
        raise ValidationError("text", f"`text.format.strict` must be a boolean, got {json_type(strict)}")
    description = format_.get("description")
    if description is not None and not isinstance(description, str):
        raise ValidationError("text", "`text.format.description` must be a string")
    return {"type": "json_schema", "name": name, "schema": schema, "strict": strict, "description": description}


def _response_format(text_format: dict[str, Any]) -> dict[str, Any] | None:
    if text_format["type"] != "json_schema":
        return None if text_format["type"] == "text" else {"type": text_format["type"]}
    return {"type": "json_schema", "json_schema": {"name": text_format["name"], "schema": text_format["schema"],
                                                   "strict": text_format["strict"]}}


def _tools(raw: Any) -> list[dict[str, Any]]:
    """Function tools in the Responses shape ({"type": "function", "name", "parameters", ...})."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValidationError("tools", f"`tools` must be an array of tools, got {json_type(raw)}")
    return [_tool(item, f"tools[{index}]") for index, item in enumerate(raw)]


def _tool(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValidationError("tools", f"`{where}` must be an object, got {json_type(item)}")
    kind = item.get("type")
    if kind != "function":
        raise ValidationError("tools", f"`{where}.type` is {json.dumps(kind)}: this server has function tools "
                                       f"only (no tool that OpenAI runs itself, such as web_search or file_search)")
    unknown = sorted(set(item) - _TOOL_FIELDS)
    if unknown:
        raise ValidationError("tools", f"`{where}.{unknown[0]}` is not supported by this server")
    name, parameters = item.get("name"), item.get("parameters")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValidationError("tools", f"`{where}.name` must be 1 to 64 letters, digits, _ or -")
    if parameters is not None and not isinstance(parameters, dict):
        raise ValidationError("tools", f"`{where}.parameters` must be a JSON Schema object")
    if item.get("description") is not None and not isinstance(item["description"], str):
        raise ValidationError("tools", f"`{where}.description` must be a string")
    if item.get("strict") is not None and not isinstance(item["strict"], bool):
        raise ValidationError("tools", f"`{where}.strict` must be a boolean")
    return {"type": "function", "name": name, "description": item.get("description"), "parameters": parameters,
            "strict": item.get("strict")}


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool[key] is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(raw: Any) -> Any:
    """none, auto, required, or {"type": "function", "name"} (chat's shape nests the name)."""
    if raw is None or raw in ("none", "auto", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str):
        return {"type": "function", "function": {"name": raw["name"]}}
    raise ValidationError("tool_choice", "`tool_choice` must be none, auto, required or "
                                         "{\"type\": \"function\", \"name\": ...} on this server")


def _metadata(raw: Any) -> dict[str, str]:
    """Up to 16 string pairs (keys up to 64 characters, values up to 512), echoed as given."""
    if raw is None:
        return {}
    if (not isinstance(raw, dict) or len(raw) > _MAX_METADATA_KEYS
            or not all(isinstance(v, str) and len(k) <= _MAX_METADATA_KEY and len(v) <= _MAX_METADATA_VALUE
                       for k, v in raw.items())):
        raise ValidationError("metadata", f"`metadata` must be an object of at most {_MAX_METADATA_KEYS} string "
                                          f"values, keys up to {_MAX_METADATA_KEY} characters, values up to "
                                          f"{_MAX_METADATA_VALUE}")
    return raw
