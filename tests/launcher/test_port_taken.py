"""`ztgi launch` on a port another server holds stops at once, saying so, with a non-zero exit."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from ztgi.services.launcher.port_check import PortTakenError, check_port_free


def listening_socket(reuse_port: bool = False) -> socket.socket:
    held = socket.socket()
    if reuse_port:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    held.bind(("127.0.0.1", 0))
    held.listen()
    return held


def test_launch_on_a_taken_port_fails_at_once() -> None:
    """No child starts: the launcher exits 1 within seconds, naming the port and --port."""
    with listening_socket() as held:
        port = held.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "ztgi.services.launcher", "--port", str(port)],
                                capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "--port" in result.stderr
    assert "processes" not in result.stderr and "ztgi is serving" not in result.stdout  # no child started
    assert elapsed < 60  # the imports alone; a started pipeline would load and warm up a model first


@pytest.mark.parametrize("reuse_port", [False, True])
def test_check_finds_a_listener_sharing_its_port_too(reuse_port: bool) -> None:
    """A listener with SO_REUSEPORT (as several gateways use) is found as well; a free port passes."""
    with listening_socket(reuse_port) as held:
        with pytest.raises(PortTakenError, match="choose a free one with --port"):
            check_port_free("127.0.0.1", held.getsockname()[1])
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    check_port_free("127.0.0.1", port)


def test_a_host_that_does_not_resolve_is_said_so() -> None:
    with pytest.raises(PortTakenError, match="does not resolve"):
        check_port_free("no-such-host.invalid", 8080)
