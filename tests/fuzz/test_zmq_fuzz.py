"""Hostile ZMQ frames straight at every socket: logged and dropped or answered, never a crash.

Each test runs real processes and plays the other side with extra sockets: random bytes,
truncated messages, well-formed messages of the wrong type or out of range, multipart frames.
Afterwards a valid request still succeeds and every process is still alive. The number of cases
each test ran is printed (run with `-s` to see it).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import Keys
from tests.fuzz.frames import frame, multipart, tags_of, wire_message
from tests.fuzz.fuzz_settings import FUZZ, SCALE
from tests.fuzz.processes import HEARTBEAT, LIMITS, Pipeline, ServiceProcess
from ztgi.common.client.sync_client import ZtgiClient
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode, encode
from ztgi.common.curve import CurveKeys, client_keys
from ztgi.common.curve import apply as apply_curve
from ztgi.common.endpoints import Endpoints
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    Adopt,
    CommandDone,
    DetokenizeJob,
    Encoded,
    EncodeJob,
    ErrorReply,
    Forget,
    Generate,
    GenerateParameters,
    Generation,
    Heartbeat,
    Hello,
    Query,
    Rejected,
    RequestKey,
    SamplingParameters,
    StatsReply,
    TextBatch,
    TokenStep,
    Warmup,
    WarmupResult,
    WorkerInfo,
)
from ztgi.common.messages import (
    HealthCheck as HealthCheckCommand,
)
from ztgi.services.scheduler.scheduler import CLIENT_MESSAGES, TOKENIZER_MESSAGES, WORKER_MESSAGES
from ztgi.services.tokenizer.service import SCHEDULER_MESSAGES as TOKENIZER_INBOUND
from ztgi.services.worker.service import SCHEDULER_MESSAGES as WORKER_INBOUND

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # large failing cases
NUM_CODEC_CASES = 200 * SCALE
NUM_SCHEDULER_CASES = 300 * SCALE
NUM_WORKER_CASES = 100 * SCALE
NUM_TOKENIZER_CASES = 200 * SCALE
NUM_WORKER_ANSWER_CASES = 100 * SCALE
PEER_TIMEOUT_S = 2.0  # the pipeline's scheduler: 200 ms x 10 misses


def report(name: str, num_cases: int) -> None:
    print(f"\n[fuzz] {name}: {num_cases} cases")


def connect(context: zmq.Context, kind: int, address: str, keys: CurveKeys | None = None,
            identity: bytes | None = None) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 5000)
    apply_curve(socket, keys)
    if identity is not None:
        socket.setsockopt(zmq.IDENTITY, identity)
    socket.connect(address)
    return socket


def bind(context: zmq.Context, kind: int, address: str) -> zmq.Socket:
    socket = context.socket(kind)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDTIMEO, 5000)
    socket.bind(address)
    return socket


def receive(socket: zmq.Socket, kind: type, timeout_s: float = 30.0, match: Any = None) -> Any:
    """The next message of `kind` (and `match(msg)`) on `socket`, skipping everything else."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        if not socket.poll(int(remaining * 1000)):
            break
        frames = socket.recv_multipart()
        try:
            msg = decode(frames[-1])
        except MessageError:
            continue
        if isinstance(msg, kind) and (match is None or match(msg)):
            return msg if socket.type != zmq.ROUTER else (frames[0], msg)
    raise AssertionError(f"no {kind.__name__} within {timeout_s} s")


def drain(socket: zmq.Socket) -> list[Any]:
    messages = []
    while socket.poll(0):
        try:
            messages.append(decode(socket.recv_multipart()[-1]))
        except MessageError:
            pass
    return messages


# -- the codec -----------------------------------------------------------------------------------

def test_codec_raises_only_message_error() -> None:
    """decode() of any frame returns a message or raises MessageError, never anything else."""
    num_cases = 0

    @settings(max_examples=NUM_CODEC_CASES, **FUZZ)
    @given(data=st.one_of(frame(), wire_message().map(lambda w: msgpack.packb(w, use_bin_type=True))))
    def check(data: bytes) -> None:
        nonlocal num_cases
        num_cases += 1
        try:
            decode(data)
        except MessageError:
            pass

    check()
    report("codec", num_cases)


# -- the scheduler, with a real tokenizer and worker ---------------------------------------------

def test_scheduler_survives_hostile_frames_on_every_endpoint(pipeline: tuple[Pipeline, ZtgiClient],
                                                             keys: Keys) -> None:
    """Garbage on frontend, tokenized, detokenize and workers: answered or dropped; a request then succeeds."""
    pipe, client = pipeline
    endpoints = Endpoints(pipe.scheduler_url)
    context = zmq.Context()
    sockets = {name: connect(context, zmq.DEALER, endpoints.connect(name), keys.client())
               for name in ("frontend", "detokenize", "workers")}
    sockets["tokenized"] = connect(context, zmq.PUSH, endpoints.connect("tokenized"), keys.client())
    # sockets of a type the endpoint does not pair with: libzmq refuses them at the handshake
    sockets["tokenize (PUSH)"] = connect(context, zmq.PUSH, endpoints.connect("tokenize"), keys.client())
    sockets["frontend (PUB)"] = connect(context, zmq.PUB, endpoints.connect("frontend"), keys.client())
    expected = {"frontend": tags_of(*CLIENT_MESSAGES), "detokenize": tags_of(*TOKENIZER_MESSAGES),
                "workers": tags_of(*WORKER_MESSAGES), "tokenized": tags_of(Encoded, Rejected)}
    num_cases = 0
    try:
        @settings(max_examples=NUM_SCHEDULER_CASES, **FUZZ)
        @given(data=st.data(), target=st.sampled_from(sorted(sockets)))
        def send(data: st.DataObject, target: str) -> None:
            nonlocal num_cases
            num_cases += 1
            frames = data.draw(multipart(expected.get(target, ())))
            try:
                sockets[target].send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                assert "(" in target, f"{target} refused a frame"  # only a refused socket type has no peer

        send()
        sockets["frontend"].send(b"\xc1not msgpack")
        answers = [receive(sockets["frontend"], ErrorReply)]
        answers += drain(sockets["frontend"])
        assert any(isinstance(a, ErrorReply) for a in answers)
    finally:
        context.destroy(linger=0)
    time.sleep(PEER_TIMEOUT_S + 0.5)  # peers the garbage registered are lost before the real request
    result = client.generate("Hello there", parameters=GenerateParameters(max_new_tokens=4, ignore_eos=True))
    assert len(result.tokens) == 4 and result.details.finish_reason == "length"
    assert pipe.all_alive(), pipe.logs()
    assert "Traceback" not in pipe.processes[0].output(), pipe.processes[0].output()
    report("scheduler endpoints", num_cases)


def test_oversized_frame_is_dropped_by_libzmq(pipeline: tuple[Pipeline, ZtgiClient], keys: Keys) -> None:
    """A frame over MAX_MESSAGE_BYTES never reaches the decoder (ZMQ_MAXMSGSIZE): no answer, no crash."""
    pipe, client = pipeline
    context = zmq.Context()
    try:
        sender = connect(context, zmq.DEALER, Endpoints(pipe.scheduler_url).connect("frontend"), keys.client())
        sender.send(b"\x00" * (MAX_MESSAGE_BYTES + 1))
        assert not sender.poll(1000), "an oversized frame was read and answered"
    finally:
        context.destroy(linger=0)
    assert client.health().healthy and pipe.all_alive()
    assert "exceeds the" not in pipe.processes[0].output()  # the codec's own check never saw it


def test_curve_lets_in_only_the_right_keys(pipeline: tuple[Pipeline, ZtgiClient], keys: Keys) -> None:
    """Over tcp:// with CURVE, a socket without the key, with a wrong server key or an unknown client key gets
    nothing."""
    pipe, client = pipeline
    address = Endpoints(pipe.scheduler_url).connect("frontend")
    stranger = client_keys(keys.server_public, keys.stranger_secret)
    wrong_server = client_keys(keys.client_public, keys.client_secret)  # not the scheduler's public key
    context = zmq.Context()
    try:
        sockets = [connect(context, zmq.DEALER, address, k) for k in (None, stranger, wrong_server, keys.client())]
        hello = encode(Hello(role="client", protocol_version=PROTOCOL_VERSION, boot_nonce="probe"))
        for socket in sockets[:-1]:
            try:
                socket.send(hello, zmq.NOBLOCK)
            except zmq.Again:  # its handshake already failed, so it has no connection to queue on
                pass
        sockets[-1].send(hello)  # within SNDTIMEO
        assert sockets[-1].poll(10_000), "the authorised socket got no answer"
        assert not any(socket.poll(0) for socket in sockets[:-1]), "a socket without the right key got an answer"
    finally:
        context.destroy(linger=0)
    result = client.generate("Hi", parameters=GenerateParameters(max_new_tokens=2, ignore_eos=True))
    assert len(result.tokens) == 2


def test_scheduler_survives_a_worker_that_answers_anything(tmp_path) -> None:
    """A registered worker answering each command with any worker message (its id right): no crash."""
    endpoints = Endpoints(f"ipc://{tempfile.mkdtemp(prefix='ztgi-')}")
    scheduler = ServiceProcess("scheduler", "--scheduler-url", endpoints.scheduler_url, *HEARTBEAT,
                               "--heartbeat-misses", "50", "--drain-timeout-s", "1", *LIMITS)
    context = zmq.Context()
    worker = connect(context, zmq.DEALER, endpoints.connect("workers"), identity=b"fake-worker")
    tokenize = connect(context, zmq.PULL, endpoints.connect("tokenize"))
    tokenized = connect(context, zmq.PUSH, endpoints.connect("tokenized"))
    client = connect(context, zmq.DEALER, endpoints.connect("frontend"), identity=b"client")
    info = WorkerInfo("fake", "float32", "cpu", [2], 100, 2048)
    num_cases = 0
    command_id = 0  # the command the fake worker is to answer
    try:
        worker.send(encode(Hello("worker", PROTOCOL_VERSION, "fake", info)))
        warmup = receive(worker, Warmup)
        worker.send(encode(WarmupResult(warmup.command_id, 10_000)))

        @settings(max_examples=NUM_WORKER_ANSWER_CASES, **FUZZ)
        @given(answer=wire_message(tags_of(*WORKER_MESSAGES)), new_request=st.booleans())
        def step(answer: list, new_request: bool) -> None:
            nonlocal num_cases, command_id
            num_cases += 1
            if new_request:
                client.send(encode(Generate(f"r{num_cases}", "Hi", None, GenerateParameters(max_new_tokens=3))))
            while tokenize.poll(20):  # the tokenizer's part, done right
                key = decode(tokenize.recv()).key
                tokenized.send(encode(Encoded(key, [1, 2], SamplingParameters(), 3, False, 0, False, b"tok")))
            command_id = max([command_id, *(m.command_id for m in drain(worker) if hasattr(m, "command_id"))])
            if answer[0] not in ("hello", "heartbeat"):
                answer[1] = command_id  # every answer type starts with the command id
            worker.send(msgpack.packb(answer, use_bin_type=True))

        step()
        client.send(encode(Query("stats", "stats")))
        assert receive(client, StatsReply, timeout_s=10)
        assert scheduler.alive, scheduler.output()
    finally:
        context.destroy(linger=0)
        assert scheduler.stop() == 0, scheduler.output()
        shutil.rmtree(endpoints.run_dir, ignore_errors=True)
    assert "Traceback" not in scheduler.output(), scheduler.output()
    report("worker answers to the scheduler", num_cases)


def test_a_duplicated_encode_answer_does_not_forget_a_live_request() -> None:
    """An encode job answered twice (re-pushed after a tokenizer loss) leaves the owner's state alone;
    a copy encoded by another tokenizer is forgotten there."""
    endpoints = Endpoints(f"ipc://{tempfile.mkdtemp(prefix='ztgi-')}")
    scheduler = ServiceProcess("scheduler", "--scheduler-url", endpoints.scheduler_url, *HEARTBEAT,
                               "--heartbeat-misses", "50", "--drain-timeout-s", "1", *LIMITS)
    context = zmq.Context()
    owner = connect(context, zmq.DEALER, endpoints.connect("detokenize"), identity=b"owner")
    other = connect(context, zmq.DEALER, endpoints.connect("detokenize"), identity=b"other")
    tokenize = connect(context, zmq.PULL, endpoints.connect("tokenize"))
    tokenized = connect(context, zmq.PUSH, endpoints.connect("tokenized"))
    client = connect(context, zmq.DEALER, endpoints.connect("frontend"), identity=b"client")
    try:
        for tokenizer in (owner, other):
            tokenizer.send(encode(Hello("tokenizer", PROTOCOL_VERSION, "nonce")))
            receive(tokenizer, Heartbeat)
        client.send(encode(Generate("r1", "Hi", None, GenerateParameters(max_new_tokens=3))))
        key = receive(tokenize, EncodeJob).key
        for tokenizer_id in (b"owner", b"owner", b"other"):
            tokenized.send(encode(Encoded(key, [1, 2], SamplingParameters(), 3, False, 0, False, tokenizer_id)))
        assert receive(other, Forget).keys == [key]
        assert not [m for m in drain(owner) if isinstance(m, Forget)], "the owner was told to forget a live request"
    finally:
        context.destroy(linger=0)
        assert scheduler.stop() == 0, scheduler.output()
        shutil.rmtree(endpoints.run_dir, ignore_errors=True)


# -- a worker, the test playing its scheduler -----------------------------------------------------

def test_worker_survives_hostile_frames(tiny_model_dir: str) -> None:
    """Garbage and hostile commands to a worker are answered with CommandFailed or run; it keeps serving."""
    run_dir = tempfile.mkdtemp(prefix="ztgi-")
    endpoints = Endpoints(f"ipc://{run_dir}")
    context = zmq.Context()
    scheduler = bind(context, zmq.ROUTER, endpoints.bind("workers"))
    worker = ServiceProcess("worker", "--scheduler-url", endpoints.scheduler_url, *HEARTBEAT, "--model-id",
                            tiny_model_dir, "--device", "cpu", "--dtype", "float32", "--memory-budget-mb", "16",
                            "--cpu-warmup-prefill-tokens", "64", "--num-threads", "1")
    num_cases = 0
    try:
        identity, _ = receive(scheduler, Hello, timeout_s=120)

        @settings(max_examples=NUM_WORKER_CASES, **FUZZ)
        @given(frames=multipart(tags_of(*WORKER_INBOUND)))
        def send(frames: list[bytes]) -> None:
            nonlocal num_cases
            num_cases += 1
            scheduler.send_multipart([identity, *frames])

        send()
        scheduler.send_multipart([identity, encode(HealthCheckCommand(10**9))])
        receive(scheduler, CommandDone, timeout_s=120, match=lambda done: done.command_id == 10**9)
        assert worker.alive, worker.output()
    finally:
        context.destroy(linger=0)
        assert worker.stop() == 0, worker.output()
        shutil.rmtree(run_dir, ignore_errors=True)
    report("worker", num_cases)


# -- a tokenizer, the test playing its scheduler --------------------------------------------------

def hostile_tokenizer_jobs() -> list[object]:
    """Well-formed jobs with ids no vocabulary has: they must cost one request, not the tokenizer."""
    key = RequestKey(b"client-y", "adopted")
    encoded = Encoded(key, [1, 2], SamplingParameters(), 4, False, 0, False, b"t")
    bad_ids = [-1, 2**63, 10**6]
    return [Adopt(encoded, GenerateParameters(), bad_ids),
            DetokenizeJob([TokenStep(key, Generation(1, token_id, 0.0, top_ids=[token_id], top_logprobs=[0.0],
                                                     prefill_ids=[-7], prefill_logprobs=[0.0]))
                           for token_id in bad_ids])]


def test_tokenizer_survives_hostile_frames(tiny_model_dir: str) -> None:
    """Garbage and hostile jobs on tokenize and detokenize are dropped or rejected; it keeps serving."""
    run_dir = tempfile.mkdtemp(prefix="ztgi-")
    endpoints = Endpoints(f"ipc://{run_dir}")
    context = zmq.Context()
    tokenize = bind(context, zmq.PUSH, endpoints.bind("tokenize"))
    tokenized = bind(context, zmq.PULL, endpoints.bind("tokenized"))
    detokenize = bind(context, zmq.ROUTER, endpoints.bind("detokenize"))
    tokenizer = ServiceProcess("tokenizer", "--scheduler-url", endpoints.scheduler_url, *HEARTBEAT, *LIMITS,
                               "--model-id", tiny_model_dir)
    num_cases = 0
    try:
        identity, _ = receive(detokenize, Hello, timeout_s=60)

        @settings(max_examples=NUM_TOKENIZER_CASES, **FUZZ)
        @given(data=st.data(), to_detokenize=st.booleans())
        def send(data: st.DataObject, to_detokenize: bool) -> None:
            nonlocal num_cases
            num_cases += 1
            frames = data.draw(multipart(tags_of(*TOKENIZER_INBOUND) if to_detokenize else tags_of(EncodeJob)))
            if to_detokenize:
                detokenize.send_multipart([identity, *frames])
            else:
                tokenize.send_multipart(frames)

        send()
        for msg in hostile_tokenizer_jobs():
            detokenize.send_multipart([identity, encode(msg)])
        key = RequestKey(b"client-x", "valid")
        tokenize.send(encode(EncodeJob(key, Generate("valid", "Hello", None, GenerateParameters(max_new_tokens=2)))))
        encoded = receive(tokenized, Encoded, match=lambda msg: msg.key == key)
        step = TokenStep(key, Generation(seq_id=1, token_id=encoded.input_ids[0], logprob=-0.1))
        detokenize.send_multipart([identity, encode(DetokenizeJob([step]))])
        receive(detokenize, TextBatch, match=lambda msg: any(o.client_id == b"client-x" for o in msg.outputs))
        assert tokenizer.alive, tokenizer.output()
    finally:
        context.destroy(linger=0)
        assert tokenizer.stop() == 0, tokenizer.output()
        shutil.rmtree(run_dir, ignore_errors=True)
    report("tokenizer", num_cases)
