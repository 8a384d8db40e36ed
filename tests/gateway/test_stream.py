"""POST /generate_stream and POST / with stream: TGI's SSE events, errors, disconnects."""

from __future__ import annotations

import socket

import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.openapi import validate
from tests.gateway.scripted_scheduler import ScriptedScheduler, error_steps, token_steps
from tests.gateway.sse_reader import iter_events, read_events
from ztgi.common.messages import Cancel, Generate


def stream(gateway: GatewayProcess, body: dict, path: str = "/generate_stream") -> requests.Response:
    return requests.post(gateway.url + path, json=body, stream=True, timeout=10)


def test_stream_events_follow_tgi_schema_and_order(gateway: GatewayProcess, schemas: dict) -> None:
    """One StreamResponse per token, index from 1; only the last has generated_text and details."""
    response = stream(gateway, {"inputs": "Hi", "parameters": {"max_new_tokens": 3, "details": True, "seed": 3}})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = read_events(response)
    for event in events:
        validate(event, "StreamResponse", schemas)
    assert [e["index"] for e in events] == [1, 2, 3]
    assert [e["token"]["text"] for e in events] == [" a", " b", " c"]
    assert [e["generated_text"] for e in events] == [None, None, " a b c"]
    assert [e["details"] is None for e in events] == [True, True, False]
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 3, "input_length": 2, "seed": 3,
                                     "cached_tokens": 0}


def test_stream_always_ends_with_details(gateway: GatewayProcess) -> None:
    """Even without details, the last event carries the finish reason and token counts."""
    events = read_events(stream(gateway, {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}))
    assert events[-1]["generated_text"] == " a b"
    assert events[-1]["details"]["finish_reason"] == "length" and events[-1]["details"]["input_length"] == 2


def test_stream_carries_top_tokens(gateway: GatewayProcess) -> None:
    """top_n_tokens fills each event's top_tokens."""
    events = read_events(stream(gateway, {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "top_n_tokens": 3}}))
    assert [len(e["top_tokens"]) for e in events] == [3, 3]


def test_stream_return_full_text(gateway: GatewayProcess) -> None:
    """return_full_text prepends the prompt to the final generated_text only."""
    events = read_events(stream(gateway, {"inputs": "Say:", "parameters": {"max_new_tokens": 2,
                                                                            "return_full_text": True}}))
    assert [e["generated_text"] for e in events] == [None, "Say: a b"]


def test_compat_route_streams_when_asked(gateway: GatewayProcess) -> None:
    """POST / with "stream": true answers SSE like /generate_stream."""
    response = stream(gateway, {"inputs": "Hi", "stream": True, "parameters": {"max_new_tokens": 2}}, path="/")
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert [e["token"]["text"] for e in read_events(response)] == [" a", " b"]


def test_error_mid_stream_is_a_last_error_event(gateway: GatewayProcess, scheduler: ScriptedScheduler,
                                                schemas: dict) -> None:
    """An error after tokens arrives as data: {error, error_type} and the stream ends."""
    scheduler.script = lambda g: error_steps(g.request_id, "worker lost", "generation", after_texts=[" a", " b"])
    response = stream(gateway, {"inputs": "Hi"})
    assert response.status_code == 200
    events = read_events(response)
    assert [e.get("token", {}).get("text") for e in events[:2]] == [" a", " b"]
    assert events[2:] == [{"error": "worker lost", "error_type": "generation"}]
    validate(events[2], "ErrorResponse", schemas)


def test_error_before_the_first_token_is_an_http_status(gateway: GatewayProcess,
                                                         scheduler: ScriptedScheduler) -> None:
    """Overloaded before any token: the stream request is answered 429 with a JSON error."""
    scheduler.script = lambda g: error_steps(g.request_id, "Model is overloaded", "overloaded")
    response = stream(gateway, {"inputs": "Hi"})
    assert response.status_code == 429
    assert response.json() == {"error": "Model is overloaded", "error_type": "overloaded"}


def test_client_disconnect_mid_stream_cancels_the_request(gateway: GatewayProcess,
                                                          scheduler: ScriptedScheduler) -> None:
    """Closing the HTTP connection after two events makes the gateway send Cancel."""
    scheduler.script = lambda g: token_steps(g.request_id, [" t"] * 500)
    response = stream(gateway, {"inputs": "Hi"})
    events = iter_events(response)
    next(events), next(events)
    response.close()
    request_id = scheduler.messages(Generate)[-1].request_id
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == request_id


def test_client_disconnect_mid_request_cancels_it(gateway: GatewayProcess, scheduler: ScriptedScheduler) -> None:
    """A /generate client that hangs up before the answer makes the gateway send Cancel."""
    scheduler.script = lambda g: []  # the scheduler sits on the request
    with socket.create_connection(("127.0.0.1", gateway.port)) as connection:
        body = b'{"inputs": "Hi"}'
        connection.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        generate = scheduler.wait_for(lambda m: isinstance(m, Generate))
    assert scheduler.wait_for(lambda m: isinstance(m, Cancel)).request_id == generate.request_id
