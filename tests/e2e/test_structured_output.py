"""Structured output and tool calls on a launched ztgi serving SmolLM2, through the real clients:
`openai` (response_format, tools, the `parse` helpers), `langchain-openai` (bind_tools,
with_structured_output), huggingface_hub's `InferenceClient` and `text-generation` (TGI's
`grammar`). The model is tiny: validity comes from the grammar, so answers are checked with
jsonschema and re, never for content."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest
import requests

from tests.e2e.server import LaunchedServer

MAX_TOKENS = 72
MAX_TOKENS_PARALLEL = 56  # two calls fit, a third is cut short (and left out of tool_calls)
ASK = "Reply with JSON only."
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested objects": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                    "required": ["city"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False}}, "required": ["user"],
        "additionalProperties": False},
    "bounded array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                      "minItems": 2, "maxItems": 4},
    "enum and const": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                                        "kind": {"const": "paint"}},
                       "required": ["color", "kind"], "additionalProperties": False},
    "anyOf": {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "maximum": 1000},
                                                                    {"type": "boolean"}]}},
              "required": ["value"], "additionalProperties": False},
    "nullable types": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 10},
                                                        "count": {"type": ["integer", "null"], "maximum": 50}},
                       "required": ["note", "count"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
                "required": ["code"], "additionalProperties": False},
    "formats": {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                                 "id": {"type": "string", "format": "uuid"}},
                "required": ["day", "id"], "additionalProperties": False},
    "$defs and $ref": {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["x", "y"], "additionalProperties": False}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"], "additionalProperties": False},
}
REGEXES = [r"(yes|no)", r"[0-9]{3}-[0-9]{2}", r"[A-Z][a-z]{1,8} [A-Z][a-z]{1,8}"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                     "b": {"type": "integer", "minimum": -999, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
TOOL_SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris? And what is 2 + 3?"}]


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    country: Literal["FR", "DE", "IT", "ES"]
    population_millions: int = pydantic.Field(ge=0, le=40)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    """One launched pipeline (SmolLM2) for the module."""
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")), "--max-batch-size", "16")
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def client(server: LaunchedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def all_at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Runs the calls concurrently (they share the server's batches)."""
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def chat(role_prompt: str, schema_name: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{role_prompt} Describe something as {schema_name}."}]


def streamed_text(stream: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def check_calls(calls: list[tuple[str, str]], allowed: set[str]) -> None:
    assert calls, "no tool call"
    for name, arguments in calls:
        assert name in allowed
        jsonschema.validate(json.loads(arguments), TOOL_SCHEMAS[name])


def test_every_schema_through_both_apis_streamed_and_not(client: openai.OpenAI, server: LaunchedServer) -> None:
    """Each schema of the varied set, as OpenAI's response_format (whole and streamed, sampled) and
    TGI's grammar: every answer parses and validates, and ended by itself."""
    def openai_whole(name: str, schema: dict) -> tuple[str, str]:
        answer = client.chat.completions.create(
            model="any", messages=chat(ASK, name), max_tokens=MAX_TOKENS, temperature=0, response_format={
                "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
        return answer.choices[0].message.content, answer.choices[0].finish_reason

    def openai_streamed(name: str, schema: dict) -> tuple[str, str]:
        return streamed_text(client.chat.completions.create(
            model="any", messages=chat(ASK, name), max_tokens=MAX_TOKENS, temperature=0.8, seed=3, stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}))

    def tgi(name: str, schema: dict) -> tuple[str, str]:
        answer = server.post("/generate", {"inputs": f"{ASK} {name}:", "parameters": {
            "max_new_tokens": MAX_TOKENS, "grammar": {"type": "json", "value": schema}, "details": True}},
            timeout=600).json()
        return answer["generated_text"], answer["details"]["finish_reason"]

    calls = [lambda n=name, s=schema, way=way: (s, way(n, s)) for name, schema in SCHEMAS.items()
             for way in (openai_whole, openai_streamed, tgi)]
    for schema, (text, finish) in all_at_once(calls):
        assert finish in ("stop", "eos_token"), (text, finish)
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


def test_json_object_and_regexes(client: openai.OpenAI, server: LaunchedServer) -> None:
    """json_object gives an object; TGI's regex grammar gives text the regex matches in full, streamed too."""
    answer = client.chat.completions.create(model="any", messages=chat(ASK, "a city"), max_tokens=MAX_TOKENS,
                                            temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    for regex in REGEXES:
        parameters = {"max_new_tokens": 24, "grammar": {"type": "regex", "value": regex}}
        text = server.post("/generate", {"inputs": "Answer:", "parameters": parameters},
                           timeout=600).json()["generated_text"]
        assert re.fullmatch(regex, text), (regex, text)
        events = requests.post(server.url + "/generate_stream", json={"inputs": "Answer:", "parameters": parameters},
                               stream=True, timeout=600).iter_lines()
        final = [json.loads(line[5:]) for line in events if line.startswith(b"data:")][-1]
        assert re.fullmatch(regex, final["generated_text"]), (regex, final)


def test_tool_calls_whole_and_streamed(client: openai.OpenAI) -> None:
    """required, named and auto: every call names a declared function and its arguments validate,
    whole (message.tool_calls; parallel calls, of which the tiny model may write more than
    max_tokens holds: the finished ones come back) and streamed (one call, delta.tool_calls put
    together by openai's stream helper)."""
    def whole(tool_choice: Any) -> Any:
        return client.chat.completions.create(model="any", messages=TOOL_QUESTION, tools=TOOLS, tool_choice=tool_choice,
                                              max_tokens=MAX_TOKENS_PARALLEL, temperature=0)

    def streamed(tool_choice: Any) -> Any:
        with client.beta.chat.completions.stream(model="any", messages=TOOL_QUESTION, tools=TOOLS,
                                                 tool_choice=tool_choice, parallel_tool_calls=False,
                                                 max_tokens=MAX_TOKENS, temperature=0) as stream:
            return stream.get_final_completion()

    named = {"type": "function", "function": {"name": "add"}}
    choices = ["required", named, "auto"]
    answers = all_at_once([lambda c=c, way=way: way(c) for c in choices for way in (whole, streamed)])
    for (choice, answer) in zip([c for c in choices for _ in range(2)], answers):
        message, finish = answer.choices[0].message, answer.choices[0].finish_reason
        if choice == "auto" and not message.tool_calls:
            assert finish == "stop" and not message.content.startswith("<tool_call>")
            continue
        assert finish in ("tool_calls", "length"), (choice, message)
        allowed = {"add"} if choice is named else set(TOOL_SCHEMAS)
        check_calls([(c.function.name, c.function.arguments) for c in message.tool_calls], allowed)
        assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)


def test_a_tool_conversation_goes_on(client: openai.OpenAI) -> None:
    """The assistant's call and the tool's result come back in `messages`; the model answers in text."""
    first = client.chat.completions.create(model="any", messages=TOOL_QUESTION, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                           temperature=0).choices[0].message
    results = [{"role": "tool", "tool_call_id": call.id, "content": '{"result": "sunny, 18 C"}'}
               for call in first.tool_calls]
    second = client.chat.completions.create(model="any", messages=[*TOOL_QUESTION, first.model_dump(exclude_none=True),
                                                                   *results], tools=TOOLS, tool_choice="none",
                                            max_tokens=12, temperature=0)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_openai_parse_helpers(client: openai.OpenAI) -> None:
    """beta.chat.completions.parse with a pydantic response_format and a pydantic_function_tool."""
    parsed = client.beta.chat.completions.parse(model="any", messages=chat(ASK, "a European city"),
                                                response_format=City, max_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, City)

    class Add(pydantic.BaseModel):
        a: int
        b: int

    with_tool = client.beta.chat.completions.parse(model="any", messages=TOOL_QUESTION,
                                                   tools=[openai.pydantic_function_tool(Add)], tool_choice="required",
                                                   parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(with_tool.choices[0].message.tool_calls[0].function.parsed_arguments, Add)


def test_langchain_bind_tools_and_structured_output(server: LaunchedServer) -> None:
    """langchain-openai: bind_tools gives tool_calls that validate; with_structured_output gives the
    pydantic object, by json_schema and by function calling."""
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="any", temperature=0,
                       max_tokens=MAX_TOKENS, max_retries=0, timeout=300)
    one_call = model.bind_tools(TOOLS, tool_choice="required", parallel_tool_calls=False)
    message = one_call.invoke(TOOL_QUESTION[0]["content"])
    check_calls([(c["name"], json.dumps(c["args"])) for c in message.tool_calls], set(TOOL_SCHEMAS))
    chunks = list(one_call.stream(TOOL_QUESTION[0]["content"]))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed = streamed + chunk
    check_calls([(c["name"], json.dumps(c["args"])) for c in streamed.tool_calls], set(TOOL_SCHEMAS))
    for method in ("json_schema", "function_calling"):
        city = model.with_structured_output(City, method=method).invoke(f"{ASK} Describe a European city.")
        assert isinstance(city, City)


def test_inference_client_and_text_generation_grammar(server: LaunchedServer) -> None:
    """huggingface_hub's InferenceClient and text-generation's Client send TGI's grammar unchanged."""
    from huggingface_hub import InferenceClient
    from text_generation import Client
    from text_generation.types import Grammar, GrammarType

    schema = SCHEMAS["enum and const"]
    hub = InferenceClient(base_url=server.url, timeout=300)
    text = hub.text_generation(ASK, max_new_tokens=MAX_TOKENS, grammar={"type": "json", "value": schema})
    jsonschema.validate(json.loads(text), schema)
    events = list(hub.text_generation(ASK, max_new_tokens=24, stream=True, details=True,
                                      grammar={"type": "regex", "value": REGEXES[1]}))
    assert re.fullmatch(REGEXES[1], events[-1].generated_text)
    assert events[-1].details.finish_reason == "eos_token" and events[-1].token.special
    tgi = Client(server.url, timeout=300)
    answer = tgi.generate(ASK, max_new_tokens=MAX_TOKENS, grammar=Grammar(type=GrammarType.Json, value=schema))
    jsonschema.validate(json.loads(answer.generated_text), schema)
    answer = tgi.generate("Answer:", max_new_tokens=24, grammar=Grammar(type=GrammarType.Regex, value=REGEXES[0]))
    assert re.fullmatch(REGEXES[0], answer.generated_text)


@pytest.mark.parametrize("body, path, problem", [
    ({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": {"type": "objekt"}}}}, "/generate", "objekt"),
    ({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(a"}}}, "/generate_stream", "regex"),
    ({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": {"type": "array", "uniqueItems": True}}}},
     "/generate", "uniqueItems"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"$ref": "#/$defs/nowhere"}}}}, "/v1/chat/completions", "nowhere"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {
        "name": "f", "strict": True, "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}]},
     "/v1/chat/completions", "strin"),
])
def test_a_grammar_that_cannot_compile_is_a_fast_422(server: LaunchedServer, body: dict, path: str,
                                                     problem: str) -> None:
    """Invalid schemas and regexes are refused before queueing, naming the problem; the server goes on serving."""
    started = time.monotonic()
    response = server.post(path, body, timeout=600)
    assert response.status_code == 422 and problem in response.text, response.text
    assert time.monotonic() - started < 5
    assert server.post("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
                       timeout=600).status_code == 200
