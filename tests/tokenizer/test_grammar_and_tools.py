"""The tokenizer's part in structured output: grammars checked before anything is queued, tools and
tool calls rendered through the chat template (its tool format, or in words without one)."""

from __future__ import annotations

import copy
import json
import time

import pytest

from ztgi.common.grammar import json_grammar
from ztgi.common.messages import ChatMessage, Generate, GenerateParameters, Grammar, RequestKey, Tool, ToolCall
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.common.regex_size import MAX_REGEX_SIZE
from ztgi.common.tool_calls import tool_call_grammar
from ztgi.services.tokenizer.encoder import Encoder

KEY = RequestKey(b"client-1", "r1")
WEATHER = Tool("get_weather", "The weather of a city",
               json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
CONVERSATION = [ChatMessage("user", "Weather in Paris?"),
                ChatMessage("assistant", "", [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]),
                ChatMessage("tool", "18 C and sunny", tool_call_id="call_1")]
TOOL_TEMPLATE = ("{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.role }}: "
                 "{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
                 "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}\n{% endfor %}assistant:")


@pytest.fixture(scope="module")
def encoder(tokenizer) -> Encoder:
    """One encoder for the module, its grammar vocabulary built once (as a tokenizer's start does)."""
    encoder = Encoder(tokenizer, ParameterLimits(), b"tokenizer-test")
    assert encoder.grammars.tokenizer.vocab_size == len(tokenizer)
    return encoder


def encode(encoder: Encoder, grammar: Grammar, inputs: str = "Answer:"):
    return encoder.encode(KEY, Generate("r1", inputs, None, GenerateParameters(max_new_tokens=8, grammar=grammar)))


@pytest.mark.parametrize("grammar, problem", [
    (Grammar("json", '{"type": "objekt"}'), "objekt"),
    (Grammar("json", '{"type": "array"'), "not valid"),
    (Grammar("json", '{"type": "array", "uniqueItems": true}'), "uniqueItems"),
    (Grammar("json", '{"$ref": "#/$defs/missing"}'), "missing"),
    (Grammar("regex", "[a-z"), "unclosed character class"),
    (Grammar("regex", r"(a)\1"), "backreferences"),
    (Grammar("lark", "start: nowhere"), "nowhere"),
])
def test_a_grammar_the_library_cannot_compile_is_refused_naming_the_problem(encoder, grammar, problem):
    """Invalid schemas, regexes and grammars are a validation error on `grammar`, in milliseconds."""
    started = time.monotonic()
    with pytest.raises(ValidationError) as info:
        encode(encoder, grammar)
    assert info.value.field == "grammar" and problem in str(info.value)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("grammar", [Grammar("regex", "(x{1000}){1000}"), Grammar("regex", "x{20000}"),
                                     Grammar("lark", 'start: "ok" /(x{1000}){1000}/')],
                         ids=["nested counts", "one count", "in a lark grammar"])
def test_a_regex_too_large_written_out_is_refused_in_milliseconds(encoder, grammar):
    """A regex whose counted repetitions write out to more than MAX_REGEX_SIZE positions is refused
    before llguidance compiles it (before: `(x{1000}){1000}` passed the check after 3 s, and
    failed at its second token in the worker)."""
    started = time.perf_counter()
    with pytest.raises(ValidationError, match="too large") as info:
        encode(encoder, grammar)
    assert info.value.field == "grammar" and str(MAX_REGEX_SIZE) in str(info.value)
    assert time.perf_counter() - started < 0.1
    assert encode(encoder, Grammar("regex", "[a-z]{1,4000}")).sampling.grammar is not None  # a class is one position


def test_a_valid_grammar_travels_to_the_worker_in_the_sampling_parameters(encoder):
    """The grammar is resolved into SamplingParameters unchanged; lenient schemas skip what the
    library does not implement."""
    grammar = json_grammar({"type": "array", "uniqueItems": True}, lenient=True)
    assert encode(encoder, grammar).sampling.grammar == grammar
    assert encode(encoder, Grammar("regex", "[0-9]+")).sampling.grammar == Grammar("regex", "[0-9]+")
    assert encode(encoder, tool_call_grammar([WEATHER], "auto")).sampling.grammar.type == "lark"


def test_tools_in_words_for_a_template_without_a_tool_format(encoder, tokenizer):
    """SmolLM2's ChatML has no tool format: the tools go in the system turn, the earlier call is
    written as the model writes calls, and the result comes back as a user turn."""
    ids = encoder.input_ids(Generate("r1", None, CONVERSATION, GenerateParameters(), [WEATHER]))
    prompt = tokenizer.decode(ids)
    assert prompt.startswith("<|im_start|>system\nYou can call functions.") and '"get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n18 C and sunny\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tools_through_a_template_with_a_tool_format(tokenizer):
    """A template that renders tools gets them, and the calls and results, as structure."""
    templated = copy.deepcopy(tokenizer)
    templated.chat_template = TOOL_TEMPLATE
    encoder = Encoder(templated, ParameterLimits(), b"tokenizer-test")
    prompt = encoder.render_chat(CONVERSATION, [WEATHER])
    assert prompt.startswith('TOOLS [{"type": "function", "function": {"name": "get_weather"')
    assert '"arguments": {"city": "Paris"}' in prompt and "tool: 18 C and sunny [call_1]" in prompt
