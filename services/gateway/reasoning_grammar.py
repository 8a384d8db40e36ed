"""A constrained answer's grammar with room for the reasoning before it (`--reasoning-parser`).

A grammar (`tools`, `response_format`, TGI's `grammar`) constrains an answer from its first
token, which would keep a reasoning model from thinking first. With the reasoning parser the
grammar becomes a Lark grammar: an optional `<think>...</think>` block (with one `</think>`
only), then the answer the original grammar describes; when the chat template opened the block,
the answer must first close it. The parser then reads the reasoning off and the tool calls or
JSON from the content, as without a grammar.
"""

from __future__ import annotations

import dataclasses
import json

from ztgi.common.grammar import JSON_OPTIONS
from ztgi.common.messages import Grammar
from ztgi.services.gateway.openai_schemas import OpenAIRequest

_REASONING = r"/<think>(?s:.*)<\/think>\s*/ & ~/<think>(?s:.*)<\/think>(?s:.*)<\/think>(?s:.*)/"
_OPENED_REASONING = r"/(?s:.*)<\/think>\s*/ & ~/(?s:.*)<\/think>(?s:.*)<\/think>(?s:.*)/"


def with_reasoning_room(chat: OpenAIRequest, opened: bool) -> OpenAIRequest:
    """The chat with its grammar (if any) after a reasoning block."""
    grammar = chat.parameters.grammar
    if grammar is None:
        return chat
    return dataclasses.replace(chat, parameters=dataclasses.replace(chat.parameters,
                                                                    grammar=with_reasoning(grammar, opened)))


def with_reasoning(grammar: Grammar, opened: bool) -> Grammar:
    """`grammar` after a reasoning block (optional unless the template `opened` it); a grammar
    whose answer cannot be written as a Lark rule (a JSON schema that is `true`/`false`) stays."""
    answer = _answer_rule(grammar)
    if answer is None:
        return grammar
    start = "start: REASONING answer" if opened else "start: REASONING? answer"
    return Grammar("lark", "\n".join([start, f"REASONING: {_OPENED_REASONING if opened else _REASONING}", answer]))


def _answer_rule(grammar: Grammar) -> str | None:
    """The rule `answer` (and the rules it needs) of the original grammar."""
    if grammar.type == "json":
        schema = json.loads(grammar.value)
        if not isinstance(schema, dict):
            return None
        schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **JSON_OPTIONS}}
        return f"answer: %json {json.dumps(schema, ensure_ascii=False)}"
    if grammar.type == "regex":
        return f"answer: /{_lark_regex(grammar.value)}/"
    assert grammar.value.startswith("start:"), "the gateway's Lark grammars begin with their start rule"
    return "answer:" + grammar.value[len("start:"):]


def _lark_regex(pattern: str) -> str:
    """`pattern` inside Lark's /.../: each unescaped `/` escaped, as llguidance does."""
    out, escaped = [], False
    for char in pattern:
        out.append("\\/" if char == "/" and not escaped else char)
        escaped = char == "\\" and not escaped
    return "".join(out)
