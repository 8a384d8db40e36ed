"""How a model calls tools here: the text of a call, the grammar that makes calls valid, and the
prompt that tells a model without a tool format in its chat template how to call.

A call is written as Hermes-style models (Qwen 2 and later, Hermes, SmolLM3) write it, one block
per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar fixes the name to one of the tools and the arguments to that tool's JSON schema, so a
call always parses and its arguments validate; the gateway reads calls back (`parse_calls`,
`services/gateway/tool_stream.py` for streams). With `auto` the answer is either plain text (which
cannot start like a call) or calls.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from ztgi.common.grammar import JSON_OPTIONS
from ztgi.common.messages import Grammar, Tool

RESPONSE_OPEN = "<tool_response>\n"
RESPONSE_CLOSE = "\n</tool_response>"
CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
CALL_SEPARATOR = "\n"
NAME_PREFIX = '{"name": "'
ARGUMENTS_PREFIX = '", "arguments": '
ARGUMENTS_SUFFIX = "}"
ToolMode = Literal["auto", "required"]


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it (`arguments` is JSON text)."""
    return (f"{CALL_OPEN}{NAME_PREFIX}{_json_string_body(name)}{ARGUMENTS_PREFIX}{arguments}"
            f"{ARGUMENTS_SUFFIX}{CALL_CLOSE}")


def tool_call_grammar(tools: list[Tool], mode: ToolMode, parallel: bool = True,
                      strict_names: frozenset[str] = frozenset(), text_schema: str | None = None) -> Grammar:
    """A Lark grammar: one call (or several when `parallel`) of these tools, or with `auto` also
    an answer that is not a call: plain text that does not begin like one, or JSON following
    `text_schema`. Arguments follow each tool's schema: exactly for `strict_names`, else ignoring
    keywords the library does not implement."""
    rules = [f"call_{i}: {_lark_string(CALL_OPEN + NAME_PREFIX + _json_string_body(tool.name) + ARGUMENTS_PREFIX)} "
             f"%json {_schema(json.loads(tool.parameters), tool.name in strict_names)} "
             f"{_lark_string(ARGUMENTS_SUFFIX + CALL_CLOSE)}"
             for i, tool in enumerate(tools)]
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    rules.append(f"calls: call ({_lark_string(CALL_SEPARATOR)} call)*" if parallel else "calls: call")
    if mode == "auto" and text_schema is not None:
        rules.insert(0, f"start: calls | %json {_schema(json.loads(text_schema), strict=True)}")
    elif mode == "auto":
        rules.insert(0, "start: calls | TEXT")
        rules.append(f"TEXT: /{_not_starting_with(CALL_OPEN.strip())}/")
    else:
        rules.insert(0, "start: calls")
    return Grammar("lark", "\n".join(rules))


def parse_calls(text: str, truncated: bool = False) -> list[tuple[str, str]] | None:
    """(name, arguments JSON text) of each call when `text` is nothing but calls, else None. A
    `truncated` answer (cut by the token limit) keeps the calls it finished and drops the last,
    unfinished one."""
    if not text.startswith(CALL_OPEN.strip()):
        return None
    blocks = text.split(CALL_CLOSE)
    if truncated and blocks[-1].strip():
        blocks = blocks[:-1]  # no closing tag: the call that was cut short
    calls = []
    for block in blocks:
        block = block.strip()
        if not block:
            continue
        if not block.startswith(CALL_OPEN.strip()):
            return None
        try:
            call = json.loads(block[len(CALL_OPEN.strip()):])
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        calls.append((call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
    return calls or None


def tools_prompt(tools: list[Tool]) -> str:
    """What a model whose template has no tool format is told (a system message)."""
    lines = ["You can call functions. They are listed here, one JSON object per line:", "<tools>"]
    lines += [json.dumps(tool_json(tool), ensure_ascii=False) for tool in tools]
    lines += ["</tools>", "To call functions, answer with one block per call and nothing else, each like this:",
              call_text("<function name>", "<arguments as a JSON object>"),
              "When no function helps, answer in plain text instead."]
    return "\n".join(lines)


def tool_json(tool: Tool) -> dict[str, Any]:
    """A tool as chat templates (and OpenAI) describe it."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(tool.parameters)
    return {"type": "function", "function": function}


def _schema(schema: Any, strict: bool) -> str:
    """A schema for Lark's `%json`, generated compactly; a schema's own `lenient` choice is kept.

    A tool's arguments object takes no properties beyond the declared ones unless its schema says
    otherwise: JSON Schema's default admits any extra key, and a small model then fills the call
    with invented keys until `max_tokens` cuts it, leaving no call at all (outlines, behind TGI's
    tool calls, never generates undeclared keys either)."""
    if not isinstance(schema, dict):
        return json.dumps(schema)
    if schema.get("type") == "object" and "properties" in schema:
        schema = {"additionalProperties": False, **schema}
    options = {"lenient": not strict, **schema.get("x-guidance", {}), **JSON_OPTIONS}
    return json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def _json_string_body(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _not_starting_with(prefix: str) -> str:
    """A regex (for Lark's /.../) of every text that does not begin with `prefix`."""
    alternatives = [""] + [_regex_literal(prefix[:i]) for i in range(1, len(prefix))]
    alternatives += [f"{_regex_literal(prefix[:i])}[^{_regex_literal(prefix[i])}][\\s\\S]*" for i in range(len(prefix))]
    return "(" + "|".join(alternatives) + ")"


def _regex_literal(text: str) -> str:
    return "".join(f"\\{c}" if c in _REGEX_META else c for c in text)


_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")
