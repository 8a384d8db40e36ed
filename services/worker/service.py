"""The worker process: commands in from the scheduler, answers out, heartbeats throughout.

Two threads, each with its own DEALER to the scheduler's `workers` ROUTER. The engine loop runs
on the main thread (the one that loaded the model) and owns the command socket: it says Hello,
receives each command, runs it (a prefill may take seconds) and sends the answer itself, so a
command and its answer cross no thread. The IO thread owns the liveness socket: it heartbeats
with the worker's boot nonce, by which the scheduler knows whose heartbeats they are, so a long
step never delays one; when the scheduler's answers carry a new nonce (it restarted) or say it
does not know this worker (it dropped it after a stall: `registration.py`), it tells the engine
loop over an inproc PAIR to drop every cached batch and say Hello again. A stop signal starts a
drain (`drain.py`): the heartbeats carry the grace left until the scheduler answers `drained`.

Handing each command and answer through the IO thread instead put two thread wake-ups on every
step's path; torch work split over two threads gives OpenMP two thread teams that slow each other
down, hence the main thread (BENCHMARKS.md, "The worker's command socket", "The worker process on CPU").
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import cast

import torch
import zmq

from ztgi.common import curve, handshake
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode_frames, encode
from ztgi.common.config import parse_config
from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.identity import new_boot_nonce, new_identity
from ztgi.common.lifecycle import on_stop_signals, serve
from ztgi.common.logs import setup_logging
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    CommandFailed,
    Heartbeat,
    Hello,
    Warmup,
    WarmupResult,
)
from ztgi.common.model_source import ModelNotFoundError
from ztgi.common.ready_file import ReadyFile
from ztgi.services.worker import thread_governor
from ztgi.services.worker.backend import Model
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.drain import Drain
from ztgi.services.worker.engine import COMMANDS, Engine
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.models.loading import resolve_device
from ztgi.services.worker.registration import Registration, Rejoin
from ztgi.services.worker.sampling import grammar, watermark
from ztgi.services.worker.shards.command_relay import CommandRelay
from ztgi.services.worker.shards.rank_processes import own_rank
from ztgi.services.worker.shards.shard_group import ShardGroup, ShardGroupLost
from ztgi.services.worker.thread_governor import ThreadGovernor
from ztgi.services.worker.worker_group import FollowerLoop, GroupLeader, follower

logger = logging.getLogger(__name__)

SCHEDULER_MESSAGES = (Heartbeat, *COMMANDS)
MAX_WAIT_MS = 100  # how late a stop signal may be noticed
STOP_TIMEOUT_S = 5.0  # how long the IO thread may take to notice a stop
DRAIN_HEARTBEAT_S = 0.2  # the heartbeat interval while draining, at most
RESET = b"reset"  # IO thread -> engine loop: the scheduler restarted, or dropped this worker


class EngineLoop:
    """The main thread: each command from the command socket run and answered in order, then,
    when no command waits, the engine's housekeeping (`Engine.release_freed_memory`), and on CPU
    a look at the machine's load for the intra-op thread count (`ThreadGovernor.tick`)."""

    def __init__(self, engine: Engine, commands: zmq.Socket, control: zmq.Socket, hello: Hello,
                 stop_requested: threading.Event, threads: ThreadGovernor | None = None,
                 relay: CommandRelay | None = None) -> None:
        self.engine = engine
        self.relay = relay  # a worker group's rank 0: every command goes to the other ranks first
        self.threads = threads
        self.commands = commands
        self.control = control
        self.hello = hello
        self.stop_requested = stop_requested
        self.exit_code = 0  # 1 after a failed warmup
        self.warmed_up = threading.Event()  # the scheduler's Warmup answered with a result; cleared on a reset
        self.poller = zmq.Poller()
        self.poller.register(control, zmq.POLLIN)
        self.poller.register(commands, zmq.POLLIN)

    def run(self) -> None:
        """Until a stop signal: Hello, then one command at a time; a reset from the IO thread first."""
        self._send(self.hello)
        while not self.stop_requested.is_set():
            ready = dict(self.poller.poll(MAX_WAIT_MS))
            if self.control in ready:
                self._on_control(self.control.recv())
            elif self.commands in ready:
                self.serve(self.commands.recv_multipart())
                if not cast(int, self.commands.get(zmq.EVENTS)) & zmq.POLLIN:  # an int option
                    self.engine.release_freed_memory()
                if self.threads is not None:
                    self.threads.tick()

    def serve(self, frames: list[bytes]) -> None:
        """One frame from the scheduler: a command is run and answered; anything else is answered
        with CommandFailed(-1)."""
        try:
            command = decode_frames(frames, COMMANDS)
        except MessageError as exc:
            logger.warning("bad frame from the scheduler: %s", exc)
            self._send(CommandFailed(command_id=-1, error=f"malformed message: {exc}", seq_ids=[]))
            return
        if self.relay is not None:
            self.relay.send(frames)
        self._send(self.execute(command))

    def execute(self, command: object) -> object:
        """One verb, one engine call, one answer."""
        logger.debug("command %s", type(command).__name__)
        try:
            return self._warmup(command) if isinstance(command, Warmup) else self.engine.run(command)
        except Exception as exc:  # the engine answers its own failures; this is the last resort
            logger.exception("command %s failed", type(command).__name__)
            return CommandFailed(getattr(command, "command_id", -1), f"{type(exc).__name__}: {exc}", [])

    def _warmup(self, command: Warmup) -> object:
        if self.threads is not None:  # warmup's timed step sets the step budget: time it with the right threads
            self.threads.settle()
        answer = self.engine.run(command)
        if isinstance(answer, WarmupResult):
            self.warmed_up.set()
            freeze_startup_objects()  # the model and everything alive now stay out of later collections
        elif isinstance(answer, CommandFailed) and _consistent(command):
            # the scheduler would send the same limits again, and fail again, for ever (limits that
            # contradict themselves come from no scheduler's config: that command alone is refused)
            logger.error("cannot serve with the scheduler's limits: %s; exiting", answer.error)
            self.exit_code = 1
            self.stop_requested.set()  # after this answer is sent
        return answer

    def _on_control(self, message: bytes) -> None:
        """The scheduler restarted, or dropped this worker: the commands it left are dropped, then
        every cached batch, and the scheduler hears Hello."""
        if message != RESET:
            return
        for socket in (self.control, self.commands):  # one Hello for resets that queued up meanwhile
            while True:
                try:
                    socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
        self.warmed_up.clear()  # the scheduler warms a worker up again when it registers
        self.engine.cache.clear()
        if self.relay is not None:
            self.relay.reset()
        self._send(self.hello)

    def _send(self, msg: object) -> None:
        try:
            self.commands.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # the scheduler is gone long enough to fill the queue
            logger.warning("send queue full: an answer to the scheduler was dropped")


class WorkerService:
    """Both sockets; the IO thread's heartbeats; the engine loop on the calling thread."""

    def __init__(self, config: WorkerConfig, engine: Engine, stop_requested: threading.Event,
                 drain: Drain | None = None, relay: CommandRelay | None = None) -> None:
        self.config = config
        self.stop_requested = stop_requested
        self.drain = drain or Drain(0.0, stop_requested)
        self.last_answer_at = time.monotonic()  # the scheduler's last heartbeat answer
        self.drained = False  # the scheduler said no request runs here (while draining)
        self.drain_announced = False
        self.identity = new_identity("worker")
        self.boot_nonce = new_boot_nonce()
        # asking for a Hello again after 10 heartbeats: one behind a long command has had its time
        self.registration = Registration(retry_after_s=10 * config.heartbeat_interval_ms / 1000.0)
        self.handshake = handshake.HandshakeWatch(config.curve_keys is not None, config.handshake_timeout_s)
        self.exit_code = 0
        self.ready_file = ReadyFile(config.ready_file)
        self.ready_file.clear()  # one left by an earlier process in the same pod says nothing of this one
        self.context = zmq.Context()
        self.liveness = self._dealer(self.identity + b"/liveness", watched=True)
        control_address = f"inproc://control-{self.boot_nonce}"
        self.control = self.context.socket(zmq.PAIR)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(control_address)
        engine_control = self.context.socket(zmq.PAIR)
        engine_control.setsockopt(zmq.LINGER, 0)
        engine_control.connect(control_address)
        hello = Hello(role="worker", protocol_version=PROTOCOL_VERSION, boot_nonce=self.boot_nonce,
                      worker=engine.model.info())
        # a group's ranks step together on cores of their own: none adapts its threads alone
        threads = thread_governor.for_worker(engine.model.device, config.cpu_adaptive_threads and relay is None)
        self.engine_loop = EngineLoop(engine, self._dealer(self.identity), engine_control, hello, stop_requested,
                                      threads, relay)
        self.drain.serving = self.engine_loop.warmed_up.is_set
        self.io_thread = threading.Thread(target=self._run_io, name="io", daemon=True)

    def _dealer(self, identity: bytes, watched: bool = False) -> zmq.Socket:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IDENTITY, identity)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # libzmq drops a larger frame unread
        curve.apply(socket, self.config.curve_keys)
        if watched:  # the IO thread's link says for both whether the keys are right
            self.link_monitor = handshake.watch(socket)
        socket.connect(self.config.endpoints.connect("workers"))
        return socket

    def run(self) -> None:
        """Serves until a stop signal: the IO loop on its own thread, the engine loop on this one."""
        logger.info("worker %s connected to %s", self.identity.decode(), self.config.scheduler_url)
        self.io_thread.start()
        self.engine_loop.run()

    def _run_io(self) -> None:
        try:
            self._io_loop()
        except Exception:
            logger.exception("the IO loop failed: stopping")
            self.stop_requested.set()

    def _io_loop(self) -> None:
        """Heartbeats every interval (at once when a drain starts) and the scheduler's answers to
        them, until a stop signal or the drain's end."""
        interval_s = self.config.heartbeat_interval_ms / 1000.0
        next_heartbeat = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.liveness, zmq.POLLIN)
        poller.register(self.link_monitor, zmq.POLLIN)
        while not self.stop_requested.is_set():
            if time.monotonic() >= next_heartbeat or (self.drain.draining and not self.drain_announced):
                self._send_heartbeat()
                # draining, the scheduler's `drained` is awaited: asked for more often
                next_heartbeat = time.monotonic() + (min(interval_s, DRAIN_HEARTBEAT_S) if self.drain.draining
                                                     else interval_s)
                self._give_up_on_a_failing_handshake()
            self.drain.check(self.drained, self.handshake.connected, time.monotonic() - self.last_answer_at,
                             interval_s)
            wait_ms = min(MAX_WAIT_MS, max(0, int((next_heartbeat - time.monotonic()) * 1000)))
            ready = dict(poller.poll(wait_ms))
            if self.link_monitor in ready:
                for failure in handshake.read_events(self.link_monitor, self.handshake):
                    logger.error("cannot connect to the scheduler: %s", failure)
            if self.liveness in ready:
                self.on_liveness_frames(self.liveness.recv_multipart())

    def _give_up_on_a_failing_handshake(self) -> None:
        if self.handshake.expired:
            logger.error("no handshake with the scheduler for %g s (%s): exiting",
                         self.config.handshake_timeout_s, self.handshake.failure)
            self.exit_code = 1
            self.stop_requested.set()

    def on_liveness_frames(self, frames: list[bytes]) -> None:
        """The scheduler's heartbeat: whether it restarted, or dropped this worker (`Registration`);
        while it counts this worker and the worker is warmed up, the ready file is written. Nothing
        else comes here."""
        try:
            heartbeat = decode_frames(frames, Heartbeat)
        except MessageError as exc:
            logger.warning("bad frame on the liveness socket: %s", exc)
            return
        self.last_answer_at = time.monotonic()
        rejoin = self.registration.on_heartbeat(heartbeat.boot_nonce, heartbeat.registered, self.last_answer_at)
        if self.drain.draining:  # a scheduler that dropped this worker, or a new one, runs nothing here
            self.drained = heartbeat.drained or rejoin is not None
        elif rejoin is not None:
            logger.log(logging.INFO if rejoin is Rejoin.SCHEDULER_RESTARTED else logging.WARNING,
                       "%s: dropping cached batches and registering again", rejoin.value)
            self.control.send(RESET)
        elif heartbeat.registered and self.engine_loop.warmed_up.is_set():
            self.ready_file.mark_ready()

    def _send_heartbeat(self) -> None:
        drain_s_left = self.drain.seconds_left()
        if drain_s_left is not None and not self.drain_announced:
            self.drain_announced = True
            self.ready_file.clear()  # a pod that drains takes no new requests
        try:
            self.liveness.send(encode(Heartbeat(self.boot_nonce, drain_s_left=drain_s_left)), zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("send queue full: a heartbeat was dropped")

    def close(self) -> None:
        """After `run`: stops the IO thread (bounded), then closes the sockets."""
        self.stop_requested.set()
        if self.io_thread.is_alive():
            self.io_thread.join(STOP_TIMEOUT_S)
        self.ready_file.clear()
        if not self.io_thread.is_alive():
            self.context.destroy(linger=0)


def _lower_priority_on_cpu(config: WorkerConfig) -> None:
    """A CPU worker's compute threads keep every core busy while a step runs; the pipeline's
    light processes wake for a fraction of a millisecond per step and, at equal priority, wait a
    timeslice for a core. Lowered here, before torch starts its threads (they inherit it), the
    worker yields to them. Nice alone still lets a hop wait for the worker's time slice to end; a
    task in the SCHED_IDLE class is preempted by any other task that wakes (BENCHMARKS.md, "The
    worker process on CPU")."""
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
    argv = list(argv) if argv is not None else sys.argv[1:]
    config = parse_config(WorkerConfig, argv, prog="ztgi worker")
    rank = own_rank()
    setup_logging(f"worker[{config.worker_index}]" + (f" rank {rank}" if rank else ""), config.log_level,
                  config.log_rate_limit_s)
    watermark.configure(config.watermark_gamma, config.watermark_delta)
    if rank:
        return _serve_as_rank(config, rank)
    stop_requested = threading.Event()
    drain = Drain(config.drain_timeout_s, stop_requested)
    on_stop_signals(drain.request)
    leader = None
    try:
        _lower_priority_on_cpu(config)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        if config.num_shard > 1:
            leader = GroupLeader(config, argv)
        model = _load(config, leader.group if leader is not None else None)
        if leader is not None:
            leader.wait_for_ranks()
    except (ModelNotFoundError, ValueError, TypeError, ShardGroupLost) as exc:
        logger.error("cannot load %s: %s", config.model_id, exc)
        if leader is not None:
            leader.stop()
        return 1
    try:
        if stop_requested.is_set():
            return 0
        engine = _engine(config, model)
        service = WorkerService(config, engine, stop_requested, drain, leader.relay if leader is not None else None)
        serve(service, freeze_startup=False)  # it freezes after warmup instead, with the model loaded
    except ShardGroupLost as exc:
        logger.error("the worker group cannot go on: %s; exiting", exc)
        return 1
    finally:
        if leader is not None:
            leader.stop()
    logger.info("stopped")
    return service.exit_code or service.engine_loop.exit_code


def _serve_as_rank(config: WorkerConfig, rank: int) -> int:
    """A rank rank 0 started: joins the group, loads its share, runs what rank 0 relays until stopped."""
    try:
        _lower_priority_on_cpu(config)
        group, commands = follower(config, rank)
        engine = _engine(config, _load(config, group))
        FollowerLoop(engine, commands).run()
    except (ModelNotFoundError, ValueError, TypeError) as exc:
        logger.error("cannot load %s: %s", config.model_id, exc)
    except ShardGroupLost as exc:
        logger.error("the worker group cannot go on: %s; exiting", exc)
    return 1


def _load(config: WorkerConfig, group: ShardGroup | None) -> Model:
    model = load_model(config.model_id, config.dtype, config.device, config.backend, config.kv_cache,
                       config.block_size, config.quantize, config.speculate,
                       float32_decode_attention=config.float32_decode_attention,
                       native_kernels=config.native_kernels, draft_model_id=config.draft_model_id,
                       quantized_max_rows=config.quantized_max_rows, group=group)
    grammar.configure(config.model_id, sorted(model.eos_token_ids))
    return model


def _engine(config: WorkerConfig, model: Model) -> Engine:
    """The engine; a group's ranks share the KV budget (each holds its share of every block)."""
    return Engine(model, max(1, config.memory_budget_mb // config.num_shard), config.cpu_warmup_prefill_tokens,
                  config.step_target_ms)


def _consistent(command: Warmup) -> bool:
    """Limits a scheduler's validated config could send: positive, and total above input."""
    return 1 <= command.max_input_tokens < command.max_total_tokens and command.max_batch_prefill_tokens >= 1
