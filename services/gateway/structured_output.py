"""Request fields that constrain the answer, to a `Grammar`: TGI's `grammar`, OpenAI's
`response_format`, and OpenAI's `tools` with `tool_choice` and `parallel_tool_calls`.

Every shape error is a `ValidationError` naming the field; whether the library can compile a
schema or regex is checked by the tokenizer against the vocabulary (also a 422, before queueing).
A TGI grammar or a `strict` OpenAI schema is honoured exactly or refused; a schema without
`strict` is followed as far as the library implements its keywords (OpenAI's best effort).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ztgi.common.grammar import json_grammar
from ztgi.common.messages import Grammar, Tool
from ztgi.common.parameters import ValidationError
from ztgi.common.tool_calls import tool_call_grammar
from ztgi.services.gateway.json_values import json_type

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
JSON_OBJECT_SCHEMA = {"type": "object"}


@dataclasses.dataclass(frozen=True)
class ToolUse:
    """The tools a chat may call: rendered into the prompt, their calls made valid by `grammar`."""

    tools: list[Tool]
    grammar: Grammar


def parse_tgi_grammar(raw: Any, field: str = "grammar") -> Grammar | None:
    """TGI's `{"type": "json" | "json_object" | "regex" | "json_schema", "value": ...}`."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError(field, f"`{field}` must be an object, got {json_type(raw)}")
    kind, value = raw.get("type"), raw.get("value")
    if value is None:
        raise ValidationError(field, f"`{field}.value` is missing")
    if kind in ("json", "json_object"):
        return json_grammar(_schema_value(value, f"{field}.value"))
    if kind == "json_schema":
        config = _object(value, f"{field}.value")
        return json_grammar(_schema_value(config.get("schema"), f"{field}.value.schema"),
                            lenient=not _strict(config, f"{field}.value.strict", default=True))
    if kind == "regex":
        if not isinstance(value, str):
            raise ValidationError(field, f"`{field}.value` must be a string (a regex), got {json_type(value)}")
        return Grammar("regex", value)
    raise ValidationError(field, f"`{field}.type` must be one of json, json_object, json_schema, regex. "
                                 f"Given: {json.dumps(kind)}")


def parse_response_format(raw: Any) -> Grammar | None:
    """OpenAI's `text` / `json_object` / `json_schema` (and TGI's grammar shapes)."""
    if raw is None:
        return None
    body = _object(raw, "response_format")
    kind = body.get("type")
    if kind == "text":
        return None
    if kind == "json_object" and "value" not in body:
        return json_grammar(JSON_OBJECT_SCHEMA)
    if kind == "json_schema" and "value" not in body:
        config = _object(body.get("json_schema"), "response_format.json_schema")
        schema = config.get("schema", {})
        return json_grammar(_schema_value(schema, "response_format.json_schema.schema"),
                            lenient=not _strict(config, "response_format.json_schema.strict", default=False))
    if kind in ("json", "json_object", "json_schema", "regex"):
        return parse_tgi_grammar(body, "response_format")
    raise ValidationError("response_format", "`response_format.type` must be one of text, json_object, json_schema "
                                             f"(or TGI's json, regex). Given: {json.dumps(kind)}")


def parse_tool_use(body: dict[str, Any], response_format: Grammar | None) -> ToolUse | None:
    """`tools` with `tool_choice` (default auto) and `parallel_tool_calls` (default true); None
    when there are no tools or the choice is `none`. With `auto`, an answer that is not a call
    follows `response_format` when it is a JSON schema."""
    raw_tools = body.get("tools")
    if raw_tools is None:
        if body.get("tool_choice") not in (None, "none"):
            raise ValidationError("tool_choice", "`tool_choice` needs `tools`")
        return None
    if not isinstance(raw_tools, list) or not raw_tools:
        raise ValidationError("tools", "`tools` must be a non-empty array of tools")
    parsed = [_tool(item, index) for index, item in enumerate(raw_tools)]
    tools = [tool for tool, _ in parsed]
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise ValidationError("tools", "`tools` names a function twice")
    choice = _tool_choice(body.get("tool_choice", "auto"), names)
    if choice == "none":
        return None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ValidationError("parallel_tool_calls",
                              f"`parallel_tool_calls` must be a boolean, got {json_type(parallel)}")
    callable_tools = [t for t in tools if t.name == choice] if choice not in ("auto", "required") else tools
    strict_names = frozenset(tool.name for tool, strict in parsed if strict)
    if response_format is not None and response_format.type != "json":
        raise ValidationError("response_format", "only a JSON `response_format` combines with `tools`")
    grammar = tool_call_grammar(callable_tools, "auto" if choice == "auto" else "required",
                                parallel=parallel and choice in ("auto", "required"), strict_names=strict_names,
                                text_schema=response_format.value if response_format is not None else None)
    return ToolUse(tools, grammar)


def _tool(item: Any, index: int) -> tuple[Tool, bool]:
    where = f"tools[{index}]"
    tool = _object(item, where)
    if tool.get("type", "function") != "function":
        raise ValidationError("tools", f"`{where}.type` must be \"function\"")
    function = _object(tool.get("function"), f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValidationError("tools", f"`{where}.function.name` must be 1 to 64 letters, digits, _ or -")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ValidationError("tools", f"`{where}.function.description` must be a string")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ValidationError("tools", f"`{where}.function.parameters` must be a JSON Schema object")
    strict = _strict(function, f"{where}.function.strict", default=False)
    return Tool(name, description, json.dumps(parameters, ensure_ascii=False)), strict


def _tool_choice(raw: Any, names: list[str]) -> str:
    """`none`, `auto`, `required`, or the name of the one function to call."""
    if raw in ("none", "auto", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type", "function") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if name in names:
            return name
        raise ValidationError("tool_choice", f"`tool_choice` names {json.dumps(name)}, which is not in `tools`")
    raise ValidationError("tool_choice", "`tool_choice` must be none, auto, required or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def _schema_value(value: Any, field: str) -> Any:
    """A JSON Schema given as a JSON value, or (TGI) as a string of JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValidationError(field.split(".")[0], f"`{field}` is not JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise ValidationError(field.split(".")[0],
                              f"`{field}` must be a JSON Schema (an object), got {json_type(value)}")
    return value


def _strict(config: dict[str, Any], field: str, default: bool) -> bool:
    strict = config.get("strict")
    if strict is None:
        return default
    if not isinstance(strict, bool):
        raise ValidationError(field.split(".")[0], f"`{field}` must be a boolean, got {json_type(strict)}")
    return strict


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(field.split(".")[0].split("[")[0], f"`{field}` must be an object, got {json_type(value)}")
    return value
