"""The Responses API's `input` (and `instructions`) as the chat messages of a chat completion.

`input` is a string (one user turn) or a list of items: messages (role user, system, developer
or assistant; content a string or `input_text` / `output_text` parts, and a user's `input_image`
parts: chat's `image_url` parts), `function_call` items (an
assistant's calls, merged into one assistant turn as chat's `tool_calls`) and
`function_call_output` items (chat's `tool` turns). A `developer` turn is a `system` turn, as chat
templates know only that one. A Response's `output` can be sent back as input as it is.
"""

from __future__ import annotations

import json
from typing import Any

from ztgi.common.parameters import ValidationError
from ztgi.services.gateway.json_values import json_type

_ROLE_TO_CHAT_ROLE = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"user": ("input_text",), "system": ("input_text",), "developer": ("input_text",),
               "assistant": ("output_text", "input_text")}
_ITEM_TYPES = ("message", "function_call", "function_call_output")


def chat_messages(raw_input: Any, instructions: str | None) -> list[dict[str, Any]]:
    """OpenAI chat `messages` (dicts, checked again by the chat parser) for `input`, with
    `instructions` as a system turn first."""
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for index, item in enumerate(_items(raw_input)):
        _append(messages, item, f"input[{index}]")
    return messages


def _items(raw_input: Any) -> list[Any]:
    if raw_input is None:
        raise ValidationError("input", "missing field `input`")
    if isinstance(raw_input, str):
        if not raw_input:
            raise ValidationError("input", "`input` cannot be empty")
        return [{"type": "message", "role": "user", "content": raw_input}]
    if not isinstance(raw_input, list) or not raw_input:
        raise ValidationError("input", f"`input` must be a non-empty string or a non-empty array of items, "
                                       f"got {json_type(raw_input)}")
    return raw_input


def _append(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ValidationError("input", f"`{where}` must be an object, got {json_type(item)}")
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, where))
    elif kind == "function_call":
        _append_call(messages, item, where)
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                         "content": _call_output(item.get("output"), where)})
    else:
        raise ValidationError("input", f"`{where}.type` must be one of {', '.join(_ITEM_TYPES)} on this server. "
                                       f"Given: {json.dumps(kind)}")


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLE_TO_CHAT_ROLE:
        raise ValidationError("input", f"`{where}.role` must be one of user, system, developer, assistant. "
                                       f"Given: {json.dumps(role)}")
    return {"role": _ROLE_TO_CHAT_ROLE[role], "content": _content(item.get("content"), _TEXT_PARTS[role], where,
                                                                     images=role == "user")}


def _content(content: Any, part_types: tuple[str, ...], where: str,
             images: bool = False) -> str | list[dict[str, Any]]:
    """A string, or text parts joined; with an `input_image` part (`images`: a user's), chat's parts in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValidationError("input", f"`{where}.content` must be a string or an array of parts, "
                                       f"got {json_type(content)}")
    parts = [_part(part, part_types, images, f"{where}.content[{index}]") for index, part in enumerate(content)]
    if any(part["type"] == "image_url" for part in parts):
        return parts
    return "".join(part["text"] for part in parts)


def _part(part: Any, part_types: tuple[str, ...], images: bool, where: str) -> dict[str, Any]:
    """A text part, or with `images` an image (`{"type": "input_image", "image_url": url}`), as chat's part."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in part_types and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and images:
        if not isinstance(part.get("image_url"), str) or not part["image_url"]:
            raise ValidationError("input", f"`{where}.image_url` must be a data: URL or an http(s) URL "
                                           f"(`file_id` is not supported by this server)")
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    kinds = " or ".join(part_types)
    image = " or an input_image part" if images else ""
    raise ValidationError("input", f"`{where}` must be a text part ({{\"type\": {kinds}, \"text\": ...}}){image}")


def _append_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A `function_call` joins the assistant turn before it (calls made together), or begins one."""
    call = {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        text = _content(output, ("input_text", "output_text"), f"{where}.output")
        assert isinstance(text, str), "a call's output has no image part"
        return text
    raise ValidationError("input", f"`{where}.output` must be a string or an array of text parts, "
                                   f"got {json_type(output)}")


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value and name != "arguments":
        raise ValidationError("input", f"`{where}.{name}` must be a non-empty string, got {json_type(value)}")
    return value
