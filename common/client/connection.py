"""The client's link to the scheduler's `frontend`: one DEALER, heartbeats, liveness.

The connection says `Hello`, heartbeats, reads the socket monitor's CURVE handshake events and
decodes every frame from the scheduler. Heartbeats and error replies it handles itself; the
rest goes to `on_message`. A scheduler that restarts (its heartbeat nonce changes) or goes
silent for `heartbeat_interval_ms * heartbeat_misses` is reported to `on_lost` with the reason,
so the client can fail what it has in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ztgi.common import handshake
from ztgi.common.client.errors import ZtgiError
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode_frames, encode
from ztgi.common.curve import CurveKeys
from ztgi.common.curve import apply as apply_curve
from ztgi.common.endpoints import Endpoints
from ztgi.common.identity import new_boot_nonce, new_identity
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    AdapterReply,
    ErrorReply,
    HealthReply,
    Heartbeat,
    Hello,
    InfoReply,
    StatsReply,
    StreamEvents,
    TokenizeReply,
)

logger = logging.getLogger(__name__)

INBOUND_MESSAGES = (StreamEvents, HealthReply, InfoReply, StatsReply, TokenizeReply, AdapterReply, Heartbeat,
                    ErrorReply)
MessageHandler = Callable[[object], None]
LossHandler = Callable[[str], None]


class SchedulerConnection:
    """One DEALER on the scheduler's `frontend`, with three tasks: receive, heartbeat, handshake.

    `curve_keys` encrypts the link; `handshake.expired` says when the handshake has kept failing
    for `handshake_timeout_s`.
    """

    def __init__(self, scheduler_url: str, heartbeat_interval_ms: int, heartbeat_misses: int,
                 curve_keys: CurveKeys | None, handshake_timeout_s: float) -> None:
        if heartbeat_interval_ms <= 0 or heartbeat_misses <= 0:
            raise ValueError("heartbeat_interval_ms and heartbeat_misses must be positive")
        self.scheduler_url = scheduler_url
        self.address = Endpoints(scheduler_url).connect("frontend")
        self.identity = new_identity("client")
        self.boot_nonce = new_boot_nonce()
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000.0
        self.liveness_s = self.heartbeat_interval_s * heartbeat_misses
        self.curve_keys = curve_keys
        self.handshake = handshake.HandshakeWatch(curve_keys is not None, handshake_timeout_s)
        self.tasks: list[asyncio.Task] = []
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._scheduler_nonce: str | None = None
        self._last_heard = 0.0
        self._connected = asyncio.Event()  # set by the scheduler's first word, cleared by its silence

    @property
    def is_open(self) -> bool:
        return self._socket is not None

    @property
    def can_send(self) -> bool:
        return self._socket is not None and not self._socket.closed

    def open(self, on_message: MessageHandler, on_lost: LossHandler) -> None:
        """Connects, says Hello and starts the receive, heartbeat and handshake tasks."""
        self._context = context = zmq.asyncio.Context()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, self.identity)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        apply_curve(socket, self.curve_keys)
        self._monitor = monitor = handshake.watch(socket)
        socket.connect(self.address)
        self._socket = socket
        self._last_heard = time.monotonic()
        self._send_hello()
        self.tasks = [
            asyncio.create_task(self._receive_loop(on_message, on_lost), name="ztgi-client-receive"),
            asyncio.create_task(self._heartbeat_loop(on_lost), name="ztgi-client-heartbeat"),
            asyncio.create_task(self._handshake_loop(monitor), name="ztgi-client-handshake")]
        logger.info("client %s connecting to %s", self.identity.decode(), self.address)

    def close(self) -> None:
        """Stops the tasks and closes the socket and its monitor (linger 0)."""
        for task in self.tasks:
            task.cancel()
        if self._socket is not None and self._monitor is not None and self._context is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
            self._context.term()

    def send(self, msg: object) -> None:
        """Queues a frame on the socket without waiting (the DEALER queues while disconnected)."""
        future = cast(asyncio.Future, self._live_socket.send(encode(msg), zmq.NOBLOCK))  # an asyncio socket's
        future.add_done_callback(lambda done: self._check_sent(done, msg))

    async def wait_reachable(self) -> None:
        """Waits for a first word from the scheduler, or fails fast once it counts as gone."""
        if self._connected.is_set():
            return
        remaining_s = self._last_heard + self.liveness_s - time.monotonic()
        waiter = asyncio.ensure_future(self._connected.wait())
        try:
            if not await done_within(waiter, max(0.0, remaining_s)):
                why = f": {self.handshake.failure}" if self.handshake.failure else ""
                raise ZtgiError(f"the scheduler at {self.scheduler_url} is unreachable{why}", "unhealthy")
        finally:
            waiter.cancel()

    @property
    def _live_socket(self) -> zmq.asyncio.Socket:
        assert self._socket is not None, "the client is used before start()"
        return self._socket

    def _send_hello(self) -> None:
        self.send(Hello(role="client", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce))

    @staticmethod
    def _check_sent(future: asyncio.Future, msg: object) -> None:
        if future.cancelled() or future.exception() is None:
            return
        # Again: the high-water mark is reached (a long outage); heartbeats are expendable
        level = logging.DEBUG if isinstance(msg, Heartbeat) else logging.WARNING
        logger.log(level, "could not send %s: %s", type(msg).__name__, future.exception())

    async def _receive_loop(self, on_message: MessageHandler, on_lost: LossHandler) -> None:
        """Decodes every frame from the scheduler and routes it; bad frames are logged."""
        while True:
            frames = await self._live_socket.recv_multipart()
            self._last_heard = time.monotonic()
            self._connected.set()
            try:
                msg = decode_frames(frames, INBOUND_MESSAGES)
            except MessageError as exc:
                logger.warning("bad frame from the scheduler: %s", exc)
                continue
            try:
                self._dispatch(msg, on_message, on_lost)
            except Exception:  # one bad message must not stop the routing of every other
                logger.exception("could not route %s", type(msg).__name__)

    def _dispatch(self, msg: object, on_message: MessageHandler, on_lost: LossHandler) -> None:
        match msg:
            case Heartbeat():
                self._on_scheduler_heartbeat(msg.boot_nonce, on_lost)
            case ErrorReply():
                logger.warning("the scheduler could not read a frame of ours: %s", msg.error)
            case _:
                on_message(msg)

    def _on_scheduler_heartbeat(self, nonce: str, on_lost: LossHandler) -> None:
        if self._scheduler_nonce is not None and nonce != self._scheduler_nonce:
            logger.warning("the scheduler restarted: failing what is in flight")
            on_lost("scheduler restarted")
            self._send_hello()
        self._scheduler_nonce = nonce

    async def _handshake_loop(self, monitor: zmq.asyncio.Socket) -> None:
        """Reads the socket monitor's handshake events; a failure is logged once, in words."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            failure = self.handshake.on_event(event["event"], event["value"])
            if failure is not None:
                logger.error("cannot connect to the scheduler at %s: %s", self.scheduler_url, failure)

    async def _heartbeat_loop(self, on_lost: LossHandler) -> None:
        """Heartbeats every interval and reports the scheduler lost when it goes silent."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            self.send(Heartbeat(self.boot_nonce))
            silent_s = time.monotonic() - self._last_heard
            if silent_s > self.liveness_s and self._connected.is_set():
                logger.warning("no word from the scheduler for %.1f s", silent_s)
                self._connected.clear()
                on_lost(f"the scheduler at {self.scheduler_url} did not answer for {silent_s:.1f} s")


async def done_within(future: asyncio.Future, timeout_s: float) -> bool:
    """Whether `future` is done within `timeout_s`; unlike `wait_for` before Python 3.12, never
    swallows a cancellation of the caller."""
    done, _ = await asyncio.wait({future}, timeout=timeout_s)
    return bool(done)
