"""Whether a peer's link to the scheduler completes its handshake, said in plain words.

A worker or tokenizer without the keys a CURVE scheduler wants (or with the wrong ones)
completes no handshake: ZMQ drops the connection and retries, and nothing reaches the
scheduler. Without a socket monitor the only trace is a full send queue. `HandshakeWatch`
reads the monitor's handshake events, says what is wrong and what to change, and tells its
service when the handshake has kept failing for `timeout_s` with no success since: the service
then exits non-zero, as it would for any other configuration error. A scheduler that is simply
not up yet fails no handshake (there is no connection), so a peer waits for it as long as it
takes. `connected` says whether the link is up now: a handshake succeeded and no disconnection
came since (a draining worker stops waiting for a scheduler that is gone).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

SocketT = TypeVar("SocketT", bound=zmq.Socket)

HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_DISCONNECTED)
KEYS_HELP = ("--curve-server-public-key-file (the scheduler's NAME.key) and --curve-secret-key-file "
             "(this process's NAME.key_secret, its public key in the scheduler's --curve-client-keys-dir)")


def describe_failure(event: int, value: int, curve_on: bool) -> str:
    """A failed handshake event in words: what is wrong, and what to change."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the scheduler refused this process's CURVE public key (ZAP status {value}): put its public "
                f"key file in the scheduler's --curve-client-keys-dir, or give this process {KEYS_HELP}")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        if curve_on:
            return ("this process encrypts with CURVE and the scheduler does not: drop "
                    "--curve-server-public-key-file here, or start the scheduler with --curve-secret-key-file")
        return f"the scheduler requires CURVE encryption and this process has no keys: give it {KEYS_HELP}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return f"ZMTP protocol error 0x{value:x} in the handshake (is the other end a ztgi scheduler?)"
    if curve_on:
        return ("the CURVE handshake failed: --curve-server-public-key-file is not the public key of the "
                "scheduler's --curve-secret-key-file")
    # a CURVE scheduler that reads this process's greeting first closes the connection before this
    # side has read the scheduler's: the mismatch then comes without detail (a loaded machine, a slow peer)
    return ("the handshake with the scheduler failed: the scheduler closed the connection, as one that "
            f"requires CURVE encryption does with a process that has no keys: give it {KEYS_HELP}")


class HandshakeWatch:
    """Handshake events in, a failure to report and whether to give up out."""

    def __init__(self, curve_on: bool, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.curve_on = curve_on
        self.timeout_s = timeout_s
        self.clock = clock
        self.failure: str | None = None  # the last failure, while no handshake succeeded since
        self.failing_since: float | None = None
        self.connected = False

    def on_event(self, event: int, value: int) -> str | None:
        """The failure to log now (a new one, not a repeat of the last), or None."""
        if event == zmq.EVENT_DISCONNECTED:
            self.connected = False
            return None
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.failure = self.failing_since = None
            self.connected = True
            return None
        failure = describe_failure(event, value, self.curve_on)
        if self.failing_since is None:
            self.failing_since = self.clock()
        new = failure != self.failure
        self.failure = failure
        return failure if new else None

    @property
    def expired(self) -> bool:
        """Failing, with no handshake succeeding, for longer than `timeout_s`."""
        return self.failing_since is not None and self.clock() - self.failing_since > self.timeout_s


def watch(socket: SocketT) -> SocketT:
    """A monitor socket of `socket`'s handshake and disconnection events (before it connects); poll
    it, then `read_events`."""
    return socket.get_monitor_socket(HANDSHAKE_EVENTS)


def read_events(monitor: zmq.Socket, handshake: HandshakeWatch) -> list[str]:
    """Feeds every pending event to `handshake`; the failures to log."""
    failures: list[str] = []
    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return failures
        failure = handshake.on_event(event["event"], event["value"])
        if failure is not None:
            failures.append(failure)
