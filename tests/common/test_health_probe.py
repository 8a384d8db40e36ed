"""Polling a server's /health: 200 is healthy; 503, no answer, timeout or a dead process are not."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from ztgi.common.health_probe import NotHealthyError, is_healthy, wait_until_healthy


class Health(http.server.BaseHTTPRequestHandler):
    """Answers /health with 503 for the server's first `num_unhealthy` requests, then 200."""

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HealthServer)
        server.num_requests += 1
        healthy = self.path == "/health" and server.num_requests > server.num_unhealthy
        self.send_response(200 if healthy else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class HealthServer(http.server.ThreadingHTTPServer):
    num_requests = 0
    num_unhealthy = 0


@pytest.fixture
def server() -> Iterator[HealthServer]:
    server = HealthServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url_of(server: HealthServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_waits_through_503(server: HealthServer) -> None:
    """503 answers are polled again until 200."""
    server.num_unhealthy = 3
    assert not is_healthy(url_of(server))
    wait_until_healthy(url_of(server), 10, interval_s=0.01)
    assert server.num_requests == 4


def test_times_out(server: HealthServer) -> None:
    """A server that never turns healthy raises NotHealthyError after the timeout."""
    server.num_unhealthy = 10**9
    with pytest.raises(NotHealthyError, match="not healthy after"):
        wait_until_healthy(url_of(server), 0.2, interval_s=0.01)


def test_dead_process_fails_fast() -> None:
    """Nothing listening and the server's process gone: NotHealthyError names its exit code."""
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    process.wait()
    with pytest.raises(NotHealthyError, match="exited with code 7"):
        wait_until_healthy("http://127.0.0.1:9", 60, process)
