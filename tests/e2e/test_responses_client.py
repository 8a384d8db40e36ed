"""The official `openai` client's Responses API (`client.responses`) against a launched ztgi serving
SmolLM2: text, structured output and function tools, streamed and not. Answers are validated with
the SDK's own types (`Response.model_validate` on the raw JSON, the events its stream parses);
the tiny model's content is checked only where the grammar fixes it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import Response

from tests.e2e.server import LaunchedServer

QUESTION = "What is the capital of France?"
INSTRUCTIONS = "Answer in one sentence."
NUM_TOKENS = 4
MAX_TOKENS = 48  # the schemas bound every string: a whole answer fits
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "country": {"type": "string", "maxLength": 12}},
          "required": ["city", "country"], "additionalProperties": False}
JSON_FORMAT = {"format": {"type": "json_schema", "name": "place", "schema": SCHEMA, "strict": True}}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    country: Literal["FR", "DE", "IT", "ES"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    launched = LaunchedServer(str(tmp_path_factory.mktemp("run")))
    yield launched
    assert launched.stop() == 0, launched.log


@pytest.fixture(scope="module")
def client(server: LaunchedServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def create(client: openai.OpenAI, **arguments: Any) -> Response:
    """responses.create, its raw JSON validated as the SDK's Response."""
    raw = client.responses.with_raw_response.create(model="any", **arguments)
    return Response.model_validate(json.loads(raw.text))


def streamed(client: openai.OpenAI, **arguments: Any) -> tuple[list[Any], Response]:
    """The events of responses.stream and the response its helper puts together from them."""
    with client.responses.stream(model="any", **arguments) as stream:
        events = list(stream)
        return events, stream.get_final_response()


def test_text_is_the_chat_answer_streamed_or_not(client: openai.OpenAI) -> None:
    """Greedy, input + instructions answer what chat answers to a system and a user turn; the stream's
    deltas join into the same text; max_output_tokens makes it incomplete."""
    chat = client.chat.completions.create(model="any", temperature=0, max_tokens=NUM_TOKENS, messages=[
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}])
    response = create(client, input=QUESTION, instructions=INSTRUCTIONS, temperature=0, max_output_tokens=NUM_TOKENS)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == NUM_TOKENS and response.usage.input_tokens == chat.usage.prompt_tokens
    events = list(client.responses.create(model="any", input=QUESTION, instructions=INSTRUCTIONS, temperature=0,
                                          max_output_tokens=NUM_TOKENS, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == response.output_text


def test_json_schema_answers_parse_and_validate(client: openai.OpenAI) -> None:
    """text.format json_schema (strict): the answer, whole or streamed, is JSON that the schema
    accepts, and it ended by itself; responses.parse fills a pydantic model."""
    response = create(client, input=f"Where is Paris? {INSTRUCTIONS}", text=JSON_FORMAT, max_output_tokens=MAX_TOKENS,
                      temperature=0)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    _, final = streamed(client, input="Where is Rome?", text=JSON_FORMAT, max_output_tokens=MAX_TOKENS, temperature=0)
    assert final.status == "completed"
    jsonschema.validate(json.loads(final.output_text), SCHEMA)
    parsed = client.responses.parse(model="any", input="Describe a European city as JSON.", text_format=City,
                                    max_output_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(parsed.output_parsed, City)


def test_function_call_and_its_output_round_trip(client: openai.OpenAI) -> None:
    """A required tool gives a function_call whose arguments validate; sent back with its
    function_call_output, the model answers in text."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = create(client, input=question, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                      max_output_tokens=MAX_TOKENS, temperature=0)
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    answer = create(client, input=[*question, call.model_dump(exclude_none=True),
                                   {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 C"}],
                    tools=[WEATHER], tool_choice="none", max_output_tokens=12, temperature=0)
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


def test_streamed_function_call(client: openai.OpenAI) -> None:
    """Streamed, the call's arguments arrive as deltas; the helper's final response holds the call
    the non-streamed answer gives (greedy)."""
    arguments = {"input": "What is the weather in Rome?", "tools": [WEATHER], "tool_choice": "required",
                 "parallel_tool_calls": False, "max_output_tokens": MAX_TOKENS, "temperature": 0}
    events, final = streamed(client, **arguments)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [call] = final.output
    assert deltas == call.arguments and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    [whole] = create(client, **arguments).output
    assert (whole.name, whole.arguments) == (call.name, call.arguments)


def test_unknown_field_and_hosted_tool_are_refused(client: openai.OpenAI) -> None:
    """A field this server does not serve and a tool OpenAI runs itself are 422s naming them."""
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.responses.create(model="any", input=QUESTION, reasoning={"effort": "low"})
    assert caught.value.body["param"] == "reasoning"
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.responses.create(model="any", input=QUESTION, tools=[{"type": "web_search"}])
    assert "web_search" in caught.value.body["message"]


def test_a_stored_conversation_goes_on(client: openai.OpenAI) -> None:
    """store + previous_response_id: the follow-up answers what chat answers to the whole
    conversation (greedy); the stored response is retrieved as created."""
    first = create(client, input=QUESTION, store=True, temperature=0, max_output_tokens=NUM_TOKENS)
    follow_up = create(client, input="And of Italy?", previous_response_id=first.id, temperature=0,
                       max_output_tokens=NUM_TOKENS)
    chat = client.chat.completions.create(model="any", temperature=0, max_tokens=NUM_TOKENS, messages=[
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And of Italy?"}])
    assert follow_up.output_text == chat.choices[0].message.content
    assert follow_up.usage.input_tokens == chat.usage.prompt_tokens
    assert client.responses.retrieve(first.id) == first
