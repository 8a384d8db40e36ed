"""The worker process: commands in from the scheduler, answers out, heartbeats throughout.

Two threads. The IO thread owns the DEALER to the scheduler: it says Hello, heartbeats, decodes
every frame, answers malformed ones itself and hands each command to the engine loop in order.
The engine loop runs commands one at a time (a prefill may take seconds) and passes the encoded
answer back over an inproc PAIR, which the IO thread forwards. So a long step never delays a
heartbeat, and each socket is used by one thread only.

The engine loop runs on the main thread, the one that loaded the model: torch work split over
two threads gives OpenMP two thread teams that slow each other down (a SmolLM2 decode step
measured 40 ms from a second thread against 32 ms from the loading thread).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import Sequence

import torch
import zmq

from common import curve
from common.codec import MAX_MESSAGE_BYTES, MessageError, decode, encode
from common.config import parse_config
from common.gc_freeze import freeze_startup_objects
from common.identity import new_boot_nonce, new_identity
from common.logs import setup_logging
from common.messages import (
    PROTOCOL_VERSION, Clear, CommandFailed, Decode, Filter, HealthCheck, Heartbeat, Hello, Prefill, Warmup,
    WarmupResult,
)
from common.model_source import ModelNotFoundError
from services.worker import watermark
from services.worker.config import WorkerConfig
from services.worker.engine import Engine
from services.worker.model import Model, resolve_device

logger = logging.getLogger(__name__)

SCHEDULER_MESSAGES = (Heartbeat, Warmup, Prefill, Decode, Filter, Clear, HealthCheck)
MAX_MESSAGES_PER_PASS = 64
MAX_WAIT_MS = 100  # how late a stop signal may be noticed
STOP_TIMEOUT_S = 5.0  # how long the IO thread may take to notice a stop
RESET = object()  # engine thread: the scheduler restarted, drop every cached batch


class EngineLoop:
    """Runs commands from `commands` one at a time; sends each encoded answer on an inproc PAIR,
    then, when no command waits, the engine's housekeeping (`Engine.tidy`)."""

    def __init__(self, engine: Engine, context: zmq.Context, answers_address: str) -> None:
        self.engine = engine
        self.context = context
        self.answers_address = answers_address
        self.commands: queue.Queue[object] = queue.Queue()

    def run(self) -> None:
        """Until a None command: execute, answer."""
        answers = self.context.socket(zmq.PAIR)
        answers.setsockopt(zmq.LINGER, 0)
        answers.connect(self.answers_address)
        try:
            while (command := self.commands.get()) is not None:
                if command is RESET:
                    self.engine.cache.clear()
                    continue
                answers.send(encode(self.execute(command)))
                if self.commands.empty():
                    self.engine.tidy()
        finally:
            answers.close()

    def execute(self, command: object) -> object:
        """One verb, one engine call, one answer."""
        logger.debug("command %s", type(command).__name__)
        try:
            match command:
                case Warmup():
                    return self._warmup(command)
                case Prefill():
                    return self.engine.prefill(command)
                case Decode():
                    return self.engine.decode(command)
                case Filter():
                    return self.engine.filter(command)
                case Clear():
                    return self.engine.clear(command)
                case HealthCheck():
                    return self.engine.health_check(command)
        except Exception as exc:  # the engine answers its own failures; this is the last resort
            logger.exception("command %s failed", type(command).__name__)
            return CommandFailed(command.command_id, f"{type(exc).__name__}: {exc}", [])
        raise AssertionError(f"not a command: {command!r}")

    def _warmup(self, command: Warmup) -> object:
        answer = self.engine.warmup(command)
        if isinstance(answer, WarmupResult):
            freeze_startup_objects()  # the model and everything alive now stay out of later collections
        return answer

    def stop(self) -> None:
        """Ends `run` once the command in progress (if any) is answered."""
        self.commands.put(None)

    def reset(self) -> None:
        """Drops the commands not started yet, then every cached batch."""
        while True:
            try:
                self.commands.get_nowait()
            except queue.Empty:
                break
        self.commands.put(RESET)


class WorkerService:
    """The IO thread: scheduler socket, heartbeats, and the hand-off to the engine loop."""

    def __init__(self, config: WorkerConfig, engine: Engine, stop_requested: threading.Event) -> None:
        self.config = config
        self.info = engine.model.info()
        self.stop_requested = stop_requested
        self.identity = new_identity("worker")
        self.boot_nonce = new_boot_nonce()
        self.scheduler_nonce: str | None = None
        self.context = zmq.Context()
        self.scheduler = self.context.socket(zmq.DEALER)
        self.scheduler.setsockopt(zmq.LINGER, 0)
        self.scheduler.setsockopt(zmq.IDENTITY, self.identity)
        self.scheduler.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        curve.apply(self.scheduler, config.curve_keys)
        self.scheduler.connect(config.endpoints.connect("workers"))
        answers_address = f"inproc://answers-{self.boot_nonce}"
        self.answers = self.context.socket(zmq.PAIR)
        self.answers.setsockopt(zmq.LINGER, 0)
        self.answers.bind(answers_address)
        self.engine_loop = EngineLoop(engine, self.context, answers_address)
        self.io_thread = threading.Thread(target=self._run_io, name="io", daemon=True)
        self.poller = zmq.Poller()
        self.poller.register(self.scheduler, zmq.POLLIN)
        self.poller.register(self.answers, zmq.POLLIN)

    def run(self) -> None:
        """Serves until a stop signal: the IO loop on its own thread, the engine loop on this one."""
        self.io_thread.start()
        self.engine_loop.run()

    def _run_io(self) -> None:
        try:
            self._io_loop()
        except Exception:
            logger.exception("the IO loop failed: stopping")
            self.stop_requested.set()
        finally:
            self.engine_loop.stop()

    def _io_loop(self) -> None:
        """The IO loop, until a stop signal."""
        logger.info("worker %s connected to %s", self.identity.decode(), self.config.scheduler_url)
        self._send(self._hello())
        interval_s = self.config.heartbeat_interval_ms / 1000.0
        next_heartbeat = time.monotonic() + interval_s
        while not self.stop_requested.is_set():
            wait_ms = min(MAX_WAIT_MS, max(0, int((next_heartbeat - time.monotonic()) * 1000)))
            ready = dict(self.poller.poll(wait_ms))
            if self.answers in ready:
                for frames in self._receive(self.answers):
                    self._forward(frames)
            if self.scheduler in ready:
                for frames in self._receive(self.scheduler):
                    self.on_scheduler_frames(frames)
            if time.monotonic() >= next_heartbeat:
                self._send(Heartbeat(self.boot_nonce))
                next_heartbeat = time.monotonic() + interval_s

    def on_scheduler_frames(self, frames: list[bytes]) -> None:
        """A heartbeat is handled here; a command goes to the engine thread; a bad frame is answered."""
        try:
            if len(frames) != 1:
                raise MessageError(f"expected a one-frame message, got {len(frames)} frames")
            msg = decode(frames[0], SCHEDULER_MESSAGES)
        except MessageError as exc:
            logger.warning("bad frame from the scheduler: %s", exc)
            self._send(CommandFailed(command_id=-1, error=f"malformed message: {exc}", request_ids=[]))
            return
        match msg:
            case Heartbeat():
                self._on_heartbeat(msg.boot_nonce)
            case _:
                self.engine_loop.commands.put(msg)

    def _on_heartbeat(self, scheduler_nonce: str) -> None:
        if self.scheduler_nonce is not None and scheduler_nonce != self.scheduler_nonce:
            logger.info("scheduler restarted: dropping cached batches and registering again")
            self.engine_loop.reset()
            self._send(self._hello())
        self.scheduler_nonce = scheduler_nonce

    def _hello(self) -> Hello:
        return Hello(role="worker", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce,
                     worker=self.info)

    def _receive(self, socket: zmq.Socket) -> list[list[bytes]]:
        """Up to MAX_MESSAGES_PER_PASS messages without blocking."""
        messages = []
        for _ in range(MAX_MESSAGES_PER_PASS):
            try:
                messages.append(socket.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        return messages

    def _send(self, msg: object) -> None:
        self._forward([encode(msg)])

    def _forward(self, frames: list[bytes]) -> None:
        try:
            self.scheduler.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # the scheduler is gone long enough to fill the queue
            logger.warning("send queue full: a message to the scheduler was dropped")

    def close(self) -> None:
        """After `run`: stops the IO thread (bounded), then closes the sockets."""
        self.stop_requested.set()
        if self.io_thread.is_alive():
            self.io_thread.join(STOP_TIMEOUT_S)
        if not self.io_thread.is_alive():
            self.scheduler.close(linger=0)
            self.answers.close(linger=0)
            self.context.term()


def _lower_priority_on_cpu(config: WorkerConfig) -> None:
    """A CPU worker's compute threads keep every core busy while a step runs; the pipeline's
    light processes wake for a fraction of a millisecond per step and, at equal priority, wait a
    timeslice for a core. Lowered here, before torch starts its threads (they inherit it), the
    worker yields to them: the way back from a worker's answer to the client's event took 5-15 ms
    at equal priority and about 2 ms at nice 10 (BENCHMARKS.md, "The worker process on CPU").
    Nice alone still let one hop in two wait 3-10 ms for the worker's time slice to end (a
    first token's way back, machine C); a task in the SCHED_IDLE class is preempted by any
    other task that wakes."""
    if resolve_device(config.device).type != "cpu":
        return
    if config.cpu_nice:
        os.nice(config.cpu_nice)
    if config.cpu_idle_class and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError as exc:  # a seccomp profile may refuse it: nice still applies
            logger.warning("could not enter the SCHED_IDLE class: %s", exc)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(WorkerConfig, argv, prog="ztgi worker")
    setup_logging(f"worker[{config.worker_index}]", config.log_level)
    stop_requested = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping", signum)
        stop_requested.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watermark.configure(config.watermark_gamma, config.watermark_delta)
    try:
        _lower_priority_on_cpu(config)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        model = Model(config.model_id, config.dtype, config.device, config.backend)
    except (ModelNotFoundError, ValueError, TypeError) as exc:
        logger.error("cannot load %s: %s", config.model_id, exc)
        return 1
    if stop_requested.is_set():
        return 0
    engine = Engine(model, config.memory_budget_mb, config.cpu_warmup_prefill_tokens)
    service = WorkerService(config, engine, stop_requested)
    try:
        service.run()
    finally:
        service.close()
    logger.info("stopped")
    return 0
