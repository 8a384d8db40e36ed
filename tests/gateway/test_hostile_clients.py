"""Clients that misbehave on purpose: a body declared as something else than JSON, a body that
never finishes arriving (slowloris), and a flood of malformed request lines."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.gateway.conftest import GatewayProcess
from tests.gateway.scripted_scheduler import ScriptedScheduler
from ztgi.common.messages import Generate

BODY_READ_TIMEOUT_S = 0.5
LOG_RATE_LIMIT_S = 5.0
MALFORMED = (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"GET /\x00 HTTP/1.1\r\n\r\n",
             b"GET / HTTP/9.9\r\n\r\n")


@pytest.fixture(scope="module")
def strict_gateway(shared_scheduler: ScriptedScheduler, shared_run_dir: str) -> Iterator[GatewayProcess]:
    """A gateway of its own with a short body read timeout and a short log rate-limit window."""
    gateway = GatewayProcess(f"ipc://{shared_run_dir}", "--body-read-timeout-s", str(BODY_READ_TIMEOUT_S),
                             "--log-rate-limit-s", str(LOG_RATE_LIMIT_S))
    yield gateway
    gateway.stop()


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/tokenize", "/v1/completions"])
def test_text_plain_body_is_415(gateway: GatewayProcess, scheduler: ScriptedScheduler, route: str) -> None:
    """A JSON body sent as `Content-Type: text/plain` is refused with 415, as TGI's JSON extractor does."""
    body = b'{"inputs": "Hi", "prompt": "Hi", "model": "x"}'
    response = requests.post(gateway.url + route, data=body, headers={"Content-Type": "text/plain"}, timeout=5)
    assert response.status_code == 415, response.text
    error = response.json()
    if route.startswith("/v1/"):
        assert error["error"]["code"] == "unsupported_media_type"
    else:
        assert error == {"error": "Expected request with `Content-Type: application/json`",
                         "error_type": "unsupported_media_type"}
    ok = requests.post(gateway.url + "/generate", data=b'{"inputs": "Hi"}',
                       headers={"Content-Type": "application/json; charset=utf-8"}, timeout=5)
    assert ok.status_code == 200, ok.text
    assert len(scheduler.messages(Generate)) == 1  # only the JSON one reached the scheduler


def test_partial_body_is_408_and_the_connection_closed(strict_gateway: GatewayProcess,
                                                       scheduler: ScriptedScheduler) -> None:
    """Headers and part of a body, then nothing: 408 after --body-read-timeout-s, then the connection closes."""
    with socket.create_connection(("127.0.0.1", strict_gateway.port), timeout=10) as connection:
        connection.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"inputs\": ")
        started = time.monotonic()
        answer = b""
        while chunk := connection.recv(4096):  # b"" once the server closed
            answer += chunk
        closed_s = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b'"error_type": "request_timeout"' in answer
    assert BODY_READ_TIMEOUT_S <= closed_s < 2 * BODY_READ_TIMEOUT_S + 1.0, closed_s
    assert not scheduler.messages(Generate)


def test_malformed_request_lines_are_logged_once_each_then_counted(strict_gateway: GatewayProcess) -> None:
    """300 malformed requests: one line each (no traceback) for the first few, then one line
    with the count of the rest; every one of them got its 400."""
    for request in MALFORMED * 100:
        with socket.create_connection(("127.0.0.1", strict_gateway.port), timeout=10) as connection:
            connection.sendall(request)
            assert b" 400 Bad Request" in connection.recv(100)
    deadline = time.monotonic() + LOG_RATE_LIMIT_S + 5
    while "suppressed" not in strict_gateway.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = strict_gateway.output()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "Error handling request" in line]
    assert 3 <= len(lines) <= 11, log  # ten lines, and the count
    assert "more like 'Error handling request from %s: %s (%d %s)' suppressed" in lines[-1], lines[-1]
    assert int(lines[-1].split(" more like ")[0].split()[-1]) == 300 - (len(lines) - 1)
    assert requests.get(strict_gateway.url + "/ping", timeout=5).status_code == 200
