"""HandshakeWatch: failed handshakes in plain words, and when to give up (real libzmq handshakes
over tcp://127.0.0.1 for the words, a stepped clock for the timing)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from ztgi.common import curve, handshake
from ztgi.common.handshake import HandshakeWatch

WAIT_S = 5.0


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def server(context: zmq.Context, tmp_path) -> Iterator[tuple[int, str]]:
    """A CURVE ROUTER that admits only the keys in its client directory: its port and key dir."""
    curve.write_keypair(str(tmp_path / "server"), "server")
    curve.write_keypair(str(tmp_path / "clients"), "client")
    curve.write_keypair(str(tmp_path / "stranger"), "stranger")
    authenticator = curve.start_authenticator(context, str(tmp_path / "clients"))
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    curve.apply(router, curve.server_keys(str(tmp_path / "server/server.key_secret")))
    yield router.bind_to_random_port("tcp://127.0.0.1"), str(tmp_path)
    authenticator.stop()


def first_failure(context: zmq.Context, port: int, keys: curve.CurveKeys | None) -> str:
    """What a DEALER with these keys is told when it connects to the server."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    curve.apply(dealer, keys)
    watch = HandshakeWatch(keys is not None, timeout_s=60)
    monitor = handshake.watch(dealer)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if monitor.poll(100) and (failures := handshake.read_events(monitor, watch)):
            return failures[0]
    raise AssertionError("no handshake failure reported")


def test_a_peer_without_keys_is_told_the_scheduler_wants_curve(context, server) -> None:
    """No keys against a CURVE scheduler: 'requires CURVE ... has no keys', naming the flags."""
    port, _ = server
    failure = first_failure(context, port, None)
    assert "requires CURVE encryption and this process has no keys" in failure
    assert "--curve-server-public-key-file" in failure


def test_a_keyless_peer_whose_connection_closed_is_told_the_likely_cause() -> None:
    """A handshake that ends without detail (the CURVE scheduler closed first): a process without
    keys is told what such a scheduler wants, and which flags give it."""
    failure = handshake.describe_failure(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0, curve_on=False)
    assert "requires CURVE encryption does with a process that has no keys" in failure
    assert "--curve-secret-key-file" in failure


def test_a_wrong_server_key_is_named(context, server) -> None:
    """A server public key that is not the scheduler's: the failure says so."""
    port, keys_dir = server
    keys = curve.client_keys(f"{keys_dir}/stranger/stranger.key", f"{keys_dir}/clients/client.key_secret")
    assert "is not the public key of the scheduler" in first_failure(context, port, keys)


def test_an_unlisted_client_key_is_refused_in_words(context, server) -> None:
    """A client key the scheduler's directory does not hold: 'refused this process's CURVE public key'."""
    port, keys_dir = server
    keys = curve.client_keys(f"{keys_dir}/server/server.key", f"{keys_dir}/stranger/stranger.key_secret")
    failure = first_failure(context, port, keys)
    assert "refused this process's CURVE public key (ZAP status 400)" in failure
    assert "--curve-client-keys-dir" in failure


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_gives_up_only_after_failing_for_the_timeout() -> None:
    """Failing for longer than timeout_s with no success since: expired; a success starts over;
    a repeated failure is reported once."""
    clock = Clock()
    watch = HandshakeWatch(True, timeout_s=2.0, clock=clock)
    assert watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32) is not None
    clock.now = 1.5
    assert watch.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32) is None and not watch.expired
    clock.now = 2.5
    assert watch.expired
    assert watch.on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0) is None and not watch.expired
    clock.now = 10.0
    assert not watch.expired and watch.failure is None
