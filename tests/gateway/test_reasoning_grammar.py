"""A constrained answer's grammar with room for reasoning, compiled by llguidance against SmolLM2's
vocabulary: which whole answers it lets through, token by token."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from ztgi.common.grammar import json_grammar, lltokenizer, new_matcher
from ztgi.common.messages import Grammar, Tool
from ztgi.common.model_source import ModelSource
from ztgi.common.tool_calls import call_text, tool_call_grammar
from ztgi.services.gateway.reasoning_grammar import with_reasoning
from ztgi.services.tokenizer.loading import load_tokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ADD = Tool("add", None, json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def vocabulary(smollm2: ModelSource) -> tuple[Any, llguidance.LLTokenizer]:
    tokenizer = load_tokenizer(smollm2.path)
    return tokenizer, lltokenizer(tokenizer, [tokenizer.eos_token_id])


def accepts(vocabulary: tuple[Any, llguidance.LLTokenizer], grammar: Grammar, text: str) -> bool:
    """Whether `text`, as its tokens, is a whole answer of `grammar`."""
    tokenizer, lltok = vocabulary
    matcher = new_matcher(lltok, grammar)
    return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()


@pytest.mark.parametrize("grammar", [json_grammar(SCHEMA), Grammar("regex", r'\{"a": [0-9]+\}')])
def test_reasoning_before_a_json_or_regex_answer(vocabulary: tuple, grammar: Grammar) -> None:
    """One optional think block (a single `</think>`), then exactly the original answer."""
    wrapped = with_reasoning(grammar, opened=False)
    assert wrapped.type == "lark" and accepts(vocabulary, grammar, '{"a": 1}')
    for text, accepted in [('{"a": 1}', True), ('<think>\nSo a is 1.\n</think>\n\n{"a": 1}', True),
                           ('<think>a</think> x</think>{"a": 1}', False), ('<think>a</think>{"a": "x"}', False),
                           ('<think>never closed {"a": 1}', False), ('Sure: {"a": 1}', False)]:
        assert accepts(vocabulary, wrapped, text) == accepted, text


def test_opened_template_must_close_the_block(vocabulary: tuple) -> None:
    """When the template opened `<think>`, the answer first reasons and closes it."""
    wrapped = with_reasoning(json_grammar(SCHEMA), opened=True)
    assert accepts(vocabulary, wrapped, 'So a is 1.</think>\n{"a": 1}')
    assert not accepts(vocabulary, wrapped, '{"a": 1}')


def test_reasoning_before_tool_calls(vocabulary: tuple) -> None:
    """Tool calls (or, with auto, text) may follow the reasoning; the calls keep their schema."""
    wrapped = with_reasoning(tool_call_grammar([ADD], "required"), opened=False)
    assert accepts(vocabulary, wrapped, "<think>Use add.</think>\n" + call_text("add", '{"a": 2}'))
    assert not accepts(vocabulary, wrapped, "<think>Use add.</think>\n" + call_text("add", '{"a": "2"}'))
    auto = with_reasoning(tool_call_grammar([ADD], "auto"), opened=False)
    assert accepts(vocabulary, auto, "<think>No tool needed.</think>\n\nHello!")


def test_regex_slashes_are_kept() -> None:
    """A `/` of the regex is escaped inside Lark's /.../ (an escaped one stays as it is)."""
    assert with_reasoning(Grammar("regex", r"a/b\/c"), opened=False).value.endswith(r"answer: /a\/b\/c/")
