"""The scheduler as a real process with real sockets; the test plays its neighbours."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from ztgi.common import messages as m
from ztgi.common.child_process import stop_process
from ztgi.common.codec import decode, encode
from ztgi.common.endpoints import Endpoints


@pytest.fixture
def scheduler(tmp_path):
    endpoints = Endpoints(f"ipc://{tmp_path}")
    process = subprocess.Popen([sys.executable, "-m", "ztgi.services.scheduler", "--scheduler-url",
                                endpoints.scheduler_url, "--heartbeat-interval-ms", "200",
                                "--drain-timeout-s", "2"])
    context = zmq.Context()
    yield endpoints, context
    context.destroy(linger=0)
    assert stop_process(process, 20) == 0
    assert not list(tmp_path.glob("*.sock")), "socket files left behind"


def connect(context: zmq.Context, kind: int, address: str, identity: bytes | None = None) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    if identity:
        socket.setsockopt(zmq.IDENTITY, identity)
    socket.connect(address)
    return socket


def test_encode_job_waits_for_a_tokenizer(scheduler) -> None:
    """A Generate sent before any tokenizer is connected reaches the first tokenizer that connects."""
    endpoints, context = scheduler
    client = connect(context, zmq.DEALER, endpoints.connect("frontend"), b"client-a")
    client.send(encode(m.Generate("r1", "hello", None, m.GenerateParameters())))
    client.send(encode(m.Query("q", "stats")))
    stats = decode(client.recv())
    assert isinstance(stats, m.StatsReply) and stats.num_queued == 0
    tokenizer = connect(context, zmq.PULL, endpoints.connect("tokenize"))
    job = decode(tokenizer.recv())
    assert isinstance(job, m.EncodeJob) and job.key == m.RequestKey(b"client-a", "r1")


def test_garbage_is_answered_and_service_goes_on(scheduler) -> None:
    """Garbage frames on every endpoint are dropped or answered; the scheduler keeps answering."""
    endpoints, context = scheduler
    for name in ("detokenize", "workers"):
        peer = connect(context, zmq.DEALER, endpoints.connect(name))
        peer.send_multipart([b"\x00garbage", b"two frames"])
        peer.send(b"\xc1")
    pusher = connect(context, zmq.PUSH, endpoints.connect("tokenized"))
    pusher.send(b"not msgpack at all")
    client = connect(context, zmq.DEALER, endpoints.connect("frontend"))
    client.send(b"\x93\x01")
    assert isinstance(decode(client.recv()), m.ErrorReply)
    client.send(encode(m.Query("q", "health")))
    reply = decode(client.recv())
    assert isinstance(reply, m.HealthReply) and not reply.healthy


def test_a_flood_of_malformed_frames_is_logged_as_a_count(tmp_path) -> None:
    """8,000 malformed frames from a worker socket: ten lines, then one line with the count of
    the rest (--log-rate-limit-s); the scheduler keeps answering."""
    endpoints = Endpoints(f"ipc://{tmp_path}")
    log = open(tmp_path / "scheduler.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "ztgi.services.scheduler", "--scheduler-url",
                                endpoints.scheduler_url, "--log-rate-limit-s", "1"],
                               stdout=log, stderr=subprocess.STDOUT)
    context = zmq.Context()
    try:
        client = connect(context, zmq.DEALER, endpoints.connect("frontend"))
        client.send(encode(m.Query("q0", "stats")))
        assert isinstance(decode(client.recv()), m.StatsReply)  # up
        peer = connect(context, zmq.DEALER, endpoints.connect("workers"))
        for i in range(8000):
            peer.send(b"\xc1 not msgpack %d" % i)
        deadline = time.monotonic() + 10
        while "suppressed" not in (text := (tmp_path / "scheduler.log").read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        client.send(encode(m.Query("q1", "stats")))
        assert isinstance(decode(client.recv()), m.StatsReply)
    finally:
        context.destroy(linger=0)
        stop_process(process, 20)
        log.close()
    lines = [line for line in text.splitlines() if "bad frame from worker" in line]
    assert len(lines) == 11, text[-3000:]
    assert int(lines[-1].split(" more like ")[0].split()[-1]) == 8000 - 10, lines[-1]
