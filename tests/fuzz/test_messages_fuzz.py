"""Hostile Anthropic Messages requests: the parser raises only ValidationError (a 400), and a
gateway answers every one below 500, its errors in Anthropic's shape."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.bodies import JSON, TEXT, _encode
from tests.fuzz.fuzz_settings import FUZZ, SCALE
from tests.fuzz.test_http_fuzz import short_script
from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.services.gateway.anthropic_schemas import parse_count_tokens_request, parse_messages_request

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
FIELDS = ("model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k", "stream",
          "tools", "tool_choice", "metadata", "thinking", "cache_control")
BLOCK = st.one_of(JSON, st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking",
                                                                        "image", "x"])}, optional={
    "text": st.one_of(TEXT, JSON), "id": JSON, "name": JSON, "input": JSON, "tool_use_id": JSON, "content": JSON,
    "is_error": JSON}))
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "system"]), JSON),
                                 "content": st.one_of(TEXT, st.lists(BLOCK, max_size=3), JSON)})
TOOL = st.one_of(JSON, st.fixed_dictionaries({"name": st.one_of(st.just("add"), JSON)},
                                             optional={"input_schema": JSON, "description": JSON, "type": JSON}))


@st.composite
def messages_body(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {"model": "m", "max_tokens": 3, "messages": draw(st.lists(MESSAGE, min_size=1, max_size=3))}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        body[name] = draw(st.one_of(JSON, st.lists(TOOL, max_size=2)) if name == "tools" else JSON)
    return body


@settings(max_examples=300 * SCALE, **FUZZ)
@given(body=st.one_of(messages_body(), JSON))
def test_parser_raises_only_validation_errors(body: Any) -> None:
    """Whatever the body, parsing it gives a chat request or a ValidationError (never another exception)."""
    for parse in (lambda: parse_messages_request(body, ParameterLimits(), 4), lambda: parse_count_tokens_request(body)):
        try:
            parse()
        except ValidationError:
            pass


def test_hostile_messages_to_a_gateway(scripted_gateway: tuple[GatewayProcess, ScriptedScheduler]) -> None:
    """Over HTTP: every answer is below 500, an error is Anthropic's `{type: error, error: {type, message}}`."""
    gateway, scheduler = scripted_gateway
    scheduler.script = short_script
    statuses: collections.Counter = collections.Counter()
    with requests.Session() as session:
        @settings(max_examples=80 * SCALE, **FUZZ)
        @given(body=messages_body(), path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]))
        def send(body: Any, path: str) -> None:
            response = session.post(gateway.url + path, data=_encode(body, True), timeout=60,
                                    headers={"Content-Type": "application/json"})
            assert response.status_code < 500, (body, response.status_code, response.text[:500])
            statuses[response.status_code] += 1
            if response.status_code >= 400:
                error = response.json()
                assert error["type"] == "error" and isinstance(error["error"]["message"], str), error
                assert isinstance(error["error"]["type"], str), error

        send()
    assert gateway.process.poll() is None, gateway.output()
    print(f"\n[fuzz] /v1/messages: {statuses.total()} cases, by status {dict(sorted(statuses.items()))}")
