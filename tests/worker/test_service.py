"""The worker as a real process, driven over a real ROUTER bound by the test playing the scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import zmq

from tests.worker.engine_helpers import request
from ztgi.common.child_process import stop_process
from ztgi.common.codec import decode, encode
from ztgi.common.endpoints import Endpoints
from ztgi.common.identity import new_boot_nonce
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    Batch,
    Clear,
    CommandDone,
    CommandFailed,
    Decode,
    Filter,
    FilterResult,
    HealthCheck,
    Heartbeat,
    Hello,
    Prefill,
    StepResult,
    Warmup,
    WarmupResult,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 90.0
REPLY_TIMEOUT_S = 20.0
HEARTBEAT_MS = 100


class SchedulerSide:
    """The scheduler's ROUTER on `workers`, bound; answers heartbeats with its own nonce."""

    def __init__(self, scheduler_url: str) -> None:
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(Endpoints(scheduler_url).bind("workers"))
        self.boot_nonce = new_boot_nonce()
        self.worker_id: bytes | None = None
        self.num_heartbeats = 0
        self.heartbeat_ids: set[bytes] = set()
        self.registered: bool | None = True  # what heartbeat answers say of the worker's registration

    def send(self, msg: object) -> None:
        self.router.send_multipart([self.worker_id, encode(msg)])

    def send_frames(self, *frames: bytes) -> None:
        self.router.send_multipart([self.worker_id, *frames])

    def receive(self, kind: type, timeout_s: float = REPLY_TIMEOUT_S) -> object:
        """The next message of `kind`, answering (and counting) heartbeats on the way."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if not self.router.poll(remaining * 1000):
                break
            identity, frame = self.router.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, Heartbeat):
                self.num_heartbeats += 1
                self.heartbeat_ids.add(identity)
                self.router.send_multipart([identity, encode(Heartbeat(self.boot_nonce, self.registered))])
            else:
                self.worker_id = identity  # commands go to the socket that said Hello
            if isinstance(msg, kind):
                return msg
        raise AssertionError(f"no {kind.__name__} from the worker within {timeout_s} s")

    def ask(self, msg: object, kind: type) -> object:
        self.send(msg)
        answer = self.receive(kind)
        assert getattr(answer, "command_id", None) == msg.command_id
        return answer

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    """A running `python -m ztgi.services.worker` on the tiny model, its scheduler side, and its first Hello."""
    run_dir = tmp_path_factory.mktemp("run")
    scheduler_url = f"ipc://{run_dir}"
    side = SchedulerSide(scheduler_url)
    log = open(run_dir / "worker.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "ztgi.services.worker", "--scheduler-url", scheduler_url, "--model-id", tiny_model_dir,
         "--dtype", "float32",  # the pool arithmetic below is float32's (auto may be bfloat16)
         "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--memory-budget-mb", "32",
         "--cpu-warmup-prefill-tokens", "none"],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        hello = side.receive(Hello, START_TIMEOUT_S)
        yield process, side, hello, scheduler_url
    finally:
        stop_process(process, 10)
        side.close()
        log.seek(0)
        print(log.read())
        log.close()


def test_cpu_worker_runs_at_lower_priority(worker):
    """A CPU worker lowers its priority (--cpu-nice, default 10) and enters the SCHED_IDLE class
    (--cpu-idle-class, default on), so the pipeline's processes preempt it."""
    process, _, _, _ = worker
    assert os.getpriority(os.PRIO_PROCESS, process.pid) - os.getpriority(os.PRIO_PROCESS, os.getpid()) == 10
    if hasattr(os, "SCHED_IDLE"):  # Linux
        assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE


def test_hello_carries_worker_info(worker):
    """The worker speaks first: Hello with role, protocol version, a boot nonce and its model's info."""
    _, _, hello, _ = worker
    assert hello.role == "worker" and hello.protocol_version == PROTOCOL_VERSION and hello.boot_nonce
    assert hello.worker.vocab_size == 49152 and hello.worker.eos_token_ids == [2]
    assert hello.worker.device == "cpu" and hello.worker.dtype == "float32"
    assert hello.worker.max_position_embeddings == 2048


def test_heartbeats_come_from_a_socket_of_their_own(worker):
    """Hello and answers come from the command socket; heartbeats from the liveness socket, with
    the boot nonce of the Hello."""
    _, side, hello, _ = worker
    heartbeat = side.receive(Heartbeat)
    assert heartbeat.boot_nonce == hello.boot_nonce
    assert side.heartbeat_ids and side.worker_id not in side.heartbeat_ids
    assert side.ask(HealthCheck(2), CommandDone) == CommandDone(2)


def test_heartbeats_keep_coming_during_a_long_command(worker):
    """A long (full-size) warmup runs on the engine thread: heartbeats keep arriving before its answer."""
    _, side, _, _ = worker
    side.send(Warmup(1, max_input_tokens=2000, max_total_tokens=2040, max_batch_prefill_tokens=8000,
                     max_batch_total_tokens=None))
    before = side.num_heartbeats
    started = time.monotonic()
    result = side.receive(WarmupResult)
    elapsed = time.monotonic() - started
    assert result.command_id == 1 and result.max_batch_total_tokens == 32 * 2**20 // 512
    if elapsed > 4 * HEARTBEAT_MS / 1000:
        assert side.num_heartbeats - before >= 2


def test_command_sequence(worker):
    """Prefill, Decode (concatenating two batches), Filter, Clear and HealthCheck are each answered."""
    _, side, _, _ = worker
    first = side.ask(Prefill(10, Batch(1, [request(1, [1, 2, 3], 5, ignore_eos=True, block_ids=[0])], 8)), StepResult)
    assert [g.seq_id for g in first.generations] == [1] and first.batch.seq_ids == [1]
    side.ask(Prefill(11, Batch(2, [request(2, [4, 5], 5, ignore_eos=True, do_sample=True, seed=7, block_ids=[1])], 7)),
             StepResult)
    decoded = side.ask(Decode(12, [1, 2]), StepResult)
    assert decoded.batch.batch_id == 1 and decoded.batch.seq_ids == [1, 2]
    assert [g.generated_tokens for g in decoded.generations] == [2, 2] and decoded.generations[1].seed == 7
    assert side.ask(Filter(13, 1, [2]), FilterResult).batch.seq_ids == [2]
    assert side.ask(Clear(14, None), CommandDone) == CommandDone(14)
    failed = side.ask(Decode(15, [1]), CommandFailed)
    assert "unknown batch" in failed.error
    assert side.ask(HealthCheck(16), CommandDone) == CommandDone(16)


def test_bad_input_is_answered_and_the_worker_keeps_serving(worker):
    """Garbage, an unknown tag, a wrong message and a two-frame message each get CommandFailed(-1);
    a bad Prefill gets CommandFailed naming the field; the worker still answers afterwards."""
    _, side, _, _ = worker
    for frames in ([b"\xc1garbage"], [encode(Hello("worker", 1, "x"))], [b"\x92\xa4nope\x01"], [b"a", b"b"]):
        side.send_frames(*frames)
        failed = side.receive(CommandFailed)
        assert failed.command_id == -1 and failed.seq_ids == [] and failed.error
    bad = side.ask(Prefill(20, Batch(5, [request(9, [1, 2], 3, do_sample=True, top_p=0.0)], 5)), CommandFailed)
    assert "`top_p`" in bad.error and bad.seq_ids == [9]
    assert side.ask(HealthCheck(21), CommandDone) == CommandDone(21)


def test_new_scheduler_nonce_clears_batches_and_registers_again(worker):
    """A heartbeat with a new scheduler nonce drops every cached batch and brings a new Hello."""
    _, side, _, _ = worker
    side.ask(Prefill(30, Batch(3, [request(3, [1, 2], 5, block_ids=[2])], 7)), StepResult)
    side.receive(Heartbeat)  # the worker knows the current nonce
    side.boot_nonce = new_boot_nonce()
    hello = side.receive(Hello)
    assert hello.worker is not None
    assert "unknown batch" in side.ask(Decode(31, [3]), CommandFailed).error


def test_worker_the_scheduler_dropped_clears_batches_and_registers_again(worker):
    """Heartbeat answers that say the scheduler does not know this worker (it dropped it after a
    stall) drop every cached batch and bring a new Hello, with no restart."""
    process, side, _, _ = worker
    side.ask(Prefill(35, Batch(4, [request(4, [1, 2], 5, block_ids=[4])], 7)), StepResult)
    side.registered = False
    hello = side.receive(Hello)
    side.registered = True
    assert hello.worker is not None and process.poll() is None
    assert "unknown batch" in side.ask(Decode(36, [4]), CommandFailed).error
    assert side.ask(Prefill(37, Batch(5, [request(5, [1, 2], 2, block_ids=[5])], 4)), StepResult).batch is not None


def test_a_new_router_is_served_after_the_old_one_closes(worker):
    """The scheduler restarts (its ROUTER closes, a new one binds the same address): the worker
    registers with it and answers its commands."""
    process, side, _, scheduler_url = worker
    side.router.close(linger=0)
    new_side = SchedulerSide(scheduler_url)
    try:
        hello = new_side.receive(Hello, timeout_s=REPLY_TIMEOUT_S)
        assert hello.role == "worker"
        assert new_side.ask(HealthCheck(40), CommandDone) == CommandDone(40)
        answer = new_side.ask(Prefill(41, Batch(1, [request(1, [1, 2], 2, block_ids=[3])], 4)), StepResult)
        assert answer.batch is not None
    finally:
        new_side.close()


def test_sigterm_exits_zero(worker):
    """SIGTERM stops the worker cleanly with exit code 0."""
    process, _, _, _ = worker
    assert stop_process(process, 15) == 0


def test_unknown_model_exits_with_a_clear_error(tmp_path):
    """A model id that names nothing loadable ends the process with code 1 and says why."""
    result = subprocess.run(
        [sys.executable, "-m", "ztgi.services.worker", "--scheduler-url", f"ipc://{tmp_path}",
         "--model-id", str(tmp_path / "missing.gguf")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "does not exist" in result.stderr


def test_a_kv_cache_too_small_for_one_request_is_answered_then_the_worker_exits_1(tiny_model_dir, tmp_path):
    """A Warmup whose max_total_tokens the KV cache cannot hold is answered with both numbers and
    the flags that fix it, then the worker exits with code 1 (before: it stayed, the scheduler
    dropped it, it registered again and the same warmup failed, for ever)."""
    scheduler_url = f"ipc://{tmp_path}"
    side = SchedulerSide(scheduler_url)
    process = subprocess.Popen(
        [sys.executable, "-m", "ztgi.services.worker", "--scheduler-url", scheduler_url, "--model-id", tiny_model_dir,
         "--dtype", "float32", "--heartbeat-interval-ms", str(HEARTBEAT_MS), "--cpu-warmup-prefill-tokens", "none"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        side.receive(Hello, START_TIMEOUT_S)
        side.send(Warmup(1, max_input_tokens=100, max_total_tokens=200, max_batch_prefill_tokens=400,
                         max_batch_total_tokens=100))
        failed = side.receive(CommandFailed)
        assert process.wait(timeout=30) == 1
    finally:
        stop_process(process, 10)
        side.close()
    assert "the KV cache holds 112 tokens" in failed.error and "max_total_tokens (200)" in failed.error
    assert "--max-total-tokens" in failed.error and "--memory-budget-mb" in failed.error
    assert "exiting" in process.stdout.read()
