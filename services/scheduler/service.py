"""The scheduler process: binds every endpoint and pumps frames through the Scheduler (its logic)."""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from collections.abc import Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from ztgi.common import curve
from ztgi.common.codec import MAX_MESSAGE_BYTES
from ztgi.common.config import parse_config
from ztgi.common.identity import new_boot_nonce
from ztgi.common.lifecycle import on_stop_signals, serve
from ztgi.common.logs import setup_logging
from ztgi.common.lora_adapter import AdapterError
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.peer_connections import PeerConnections
from ztgi.services.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_FRAMES_PER_PASS = 256
BACKLOG_RETRY_MS = 20


class SchedulerService:
    """Sockets and the loop: block until a frame or a tick is due, drain, act, flush."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.scheduler = Scheduler(config, new_boot_nonce())
        self.context = zmq.Context()
        self.curve_keys = config.curve_keys
        self.authenticator = curve.start_authenticator(self.context, config.curve_client_keys_dir)
        self.running = True
        self.drain_deadline: float | None = None
        self.encode_backlog: collections.deque[list[bytes]] = collections.deque()
        endpoints = config.endpoints
        if endpoints.is_ipc:
            os.makedirs(endpoints.run_dir, exist_ok=True)
        self.frontend = self._bind(zmq.ROUTER, endpoints.bind("frontend"))
        self.tokenize = self._bind(zmq.PUSH, endpoints.bind("tokenize"))
        self.tokenized = self._bind(zmq.PULL, endpoints.bind("tokenized"))
        self.detokenize = self._bind(zmq.ROUTER, endpoints.bind("detokenize"))
        self.workers = self._bind(zmq.ROUTER, endpoints.bind("workers"))
        self.poller = zmq.Poller()
        for socket in (self.frontend, self.tokenized, self.detokenize, self.workers):
            self.poller.register(socket, zmq.POLLIN)
        # a peer whose process ends closes its connection: the monitor says so at once
        self.worker_connections = PeerConnections()
        self.tokenizer_connections = PeerConnections()
        self.worker_monitor = self._monitor(self.workers)
        self.tokenizer_monitor = self._monitor(self.detokenize)

    def _monitor(self, socket: zmq.Socket) -> zmq.Socket:
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.poller.register(monitor, zmq.POLLIN)
        return monitor

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        curve.apply(socket, self.curve_keys)
        if kind == zmq.ROUTER:
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer raises, it doesn't vanish silently
        socket.bind(address)
        logger.info("bound %s%s", address, " (CURVE)" if self.curve_keys else "")
        return socket

    def run(self) -> None:
        tick_s = self.config.heartbeat_interval_ms / 1000.0
        next_tick = time.monotonic() + tick_s
        while self.running:
            timeout_ms = max(0, int((next_tick - time.monotonic()) * 1000))
            if self.encode_backlog:
                timeout_ms = min(timeout_ms, BACKLOG_RETRY_MS)
            ready = dict(self.poller.poll(timeout_ms))
            self._drain(ready)
            now = time.monotonic()
            if now >= next_tick:
                self.scheduler.tick(now)
                next_tick = now + tick_s
            self.scheduler.schedule()
            self._flush()
            if self.drain_deadline is not None:
                self._check_drain(now, self.drain_deadline)

    def drain(self) -> None:
        """SIGTERM: admit nothing new, let running requests finish within drain_timeout_s."""
        if self.drain_deadline is None:
            self.scheduler.draining = True
            self.drain_deadline = time.monotonic() + self.config.drain_timeout_s
            logger.info("draining %d requests (at most %.0f s)", len(self.scheduler.table), self.config.drain_timeout_s)

    def _check_drain(self, now: float, deadline: float) -> None:
        if len(self.scheduler.table) and now < deadline:
            return
        if len(self.scheduler.table):
            logger.warning("drain timeout: cancelling %d requests", len(self.scheduler.table))
            self.scheduler.cancel_all("Request cancelled: the server is shutting down")
            self._flush()
        self.running = False

    def _drain(self, ready: dict) -> None:
        scheduler = self.scheduler
        # disconnections first: a descriptor they name may already carry a new peer's messages
        if self.worker_monitor in ready:
            for identity in self._disconnected(self.worker_monitor, self.worker_connections):
                scheduler.on_worker_disconnected(identity)
        if self.tokenizer_monitor in ready:
            for identity in self._disconnected(self.tokenizer_monitor, self.tokenizer_connections):
                scheduler.on_tokenizer_disconnected(identity)
        if self.workers in ready:
            for identity, frame in self._receive_tracked(self.workers, self.worker_connections):
                scheduler.on_worker_frame(identity, frame)
        if self.detokenize in ready:
            for identity, frame in self._receive_tracked(self.detokenize, self.tokenizer_connections):
                scheduler.on_tokenizer_frame(identity, frame)
        if self.tokenized in ready:
            for (frame,) in self._receive(self.tokenized, 1):
                scheduler.on_tokenized_frame(frame)
        if self.frontend in ready:
            for identity, frame in self._receive(self.frontend, 2):
                scheduler.on_client_frame(identity, frame)

    def _receive(self, socket: zmq.Socket, num_frames: int) -> list[list[bytes]]:
        """Up to MAX_FRAMES_PER_PASS messages without blocking; wrong frame counts are dropped."""
        messages = []
        for _ in range(MAX_FRAMES_PER_PASS):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != num_frames:
                logger.warning("dropped a message of %d frames (expected %d)", len(frames), num_frames)
                continue
            messages.append(frames)
        return messages

    def _receive_tracked(self, socket: zmq.Socket, connections: PeerConnections) -> list[tuple[bytes, bytes]]:
        """Like `_receive` for a ROUTER of peers, noting the connection each identity spoke over."""
        messages = []
        for _ in range(MAX_FRAMES_PER_PASS):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(frames) != 2:
                logger.warning("dropped a message of %d frames (expected 2)", len(frames))
                continue
            identity = frames[0].bytes
            connections.on_message(frames[0].get(zmq.SRCFD), identity)
            messages.append((identity, frames[1].bytes))
        return messages

    @staticmethod
    def _disconnected(monitor: zmq.Socket, connections: PeerConnections) -> list[bytes]:
        """The identities whose connection closed, from the monitor's pending events."""
        identities: list[bytes] = []
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return identities
            if event["event"] == zmq.EVENT_DISCONNECTED:
                identity = connections.on_disconnected(event["value"])
                if identity is not None:
                    identities.append(identity)

    def _flush(self) -> None:
        outbox = self.scheduler.outbox
        for socket, frames_list in ((self.workers, outbox.workers), (self.detokenize, outbox.detokenize),
                                    (self.frontend, outbox.frontend)):
            for frames in frames_list:
                self._send(socket, frames)
        self._push_encode_jobs(outbox.tokenize)
        outbox.clear()

    def _push_encode_jobs(self, new_jobs: list[list[bytes]]) -> None:
        """PUSH refuses to send while no tokenizer is connected: keep the jobs, in order, until one is."""
        self.encode_backlog.extend(new_jobs)
        while self.encode_backlog:
            try:
                self.tokenize.send_multipart(self.encode_backlog[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self.encode_backlog.popleft()

    def _send(self, socket: zmq.Socket, frames: list[bytes]) -> None:
        try:
            socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("send queue full for %r; a message was dropped", frames[0][:40])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            logger.debug("peer %r unreachable: %s", frames[0], exc)

    def close(self) -> None:
        for socket in (self.frontend, self.detokenize):
            socket.setsockopt(zmq.LINGER, 1000)  # let the last events reach clients
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.destroy()
        for path in self.config.endpoints.socket_files():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(SchedulerConfig, argv, prog="ztgi scheduler")
    setup_logging("scheduler", config.log_level, config.log_rate_limit_s)
    try:
        service = SchedulerService(config)
    except AdapterError as exc:  # --lora-adapters names one that cannot be served
        logger.error("%s", exc)
        print(f"ztgi scheduler: {exc}", file=sys.stderr)
        return 2
    on_stop_signals(service.drain)
    serve(service)
    return 0
