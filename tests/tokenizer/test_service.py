"""The tokenizer as a real process; the test binds the scheduler's side of its three sockets."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import zmq

from ztgi.common.child_process import stop_process
from ztgi.common.codec import decode, encode
from ztgi.common.endpoints import Endpoints
from ztgi.common.messages import (
    PROTOCOL_VERSION,
    DetokenizeJob,
    Encoded,
    EncodeJob,
    Forget,
    Generate,
    GenerateParameters,
    Generation,
    Heartbeat,
    Hello,
    Rejected,
    RequestKey,
    StreamEvents,
    TextBatch,
    TokenStep,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 90.0
REPLY_TIMEOUT_S = 10.0


class FakeSchedulerSide:
    """The scheduler's sockets (PUSH tokenize, PULL tokenized, ROUTER detokenize), bound."""

    def __init__(self, scheduler_url: str) -> None:
        endpoints = Endpoints(scheduler_url)
        self.context = zmq.Context()
        self.tokenize = self._bind(zmq.PUSH, endpoints.bind("tokenize"))
        self.tokenized = self._bind(zmq.PULL, endpoints.bind("tokenized"))
        self.detokenize = self._bind(zmq.ROUTER, endpoints.bind("detokenize"))
        self.tokenizer_id: bytes | None = None

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(address)
        return socket

    def encode_job(self, key: RequestKey, inputs: str, scheduler_nonce: str = "",
                   **params: object) -> Encoded | Rejected:
        generate = Generate(key.request_id, inputs, None, GenerateParameters(**params))
        self.tokenize.send(encode(EncodeJob(key, generate, scheduler_nonce)))
        return self.tokenized_reply()

    def tokenized_reply(self) -> Encoded | Rejected:
        assert self.tokenized.poll(REPLY_TIMEOUT_S * 1000), "no answer on tokenized"
        return decode(self.tokenized.recv(), (Encoded, Rejected))

    def to_tokenizer(self, msg: object) -> None:
        self.detokenize.send_multipart([self.tokenizer_id, encode(msg)])

    def from_tokenizer(self, kind: type, timeout_s: float = REPLY_TIMEOUT_S) -> object:
        """The next message of `kind` on detokenize, skipping the others (heartbeats)."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if not self.detokenize.poll(remaining * 1000):
                break
            identity, frame = self.detokenize.recv_multipart()
            msg = decode(frame)
            if isinstance(msg, kind):
                self.tokenizer_id = identity
                return msg
        raise AssertionError(f"no {kind.__name__} from the tokenizer within {timeout_s} s")

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture(scope="module")
def tokenizer_process(tiny_model_dir, tmp_path_factory):
    """A running `python -m ztgi.services.tokenizer` wired to the test's scheduler sockets, and its first Hello."""
    run_dir = tmp_path_factory.mktemp("run")
    scheduler_url = f"ipc://{run_dir}"
    side = FakeSchedulerSide(scheduler_url)
    log = open(run_dir / "tokenizer.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "ztgi.services.tokenizer", "--scheduler-url", scheduler_url,
         "--model-id", tiny_model_dir, "--max-input-tokens", "32", "--max-total-tokens", "64",
         "--heartbeat-interval-ms", "100"],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        hello = side.from_tokenizer(Hello, START_TIMEOUT_S)
        yield process, side, hello
    finally:
        stop_process(process, 10)
        side.close()
        log.seek(0)
        sys.stderr.write(log.read()[-4000:])
        log.close()


def test_hello_arrives_first(tokenizer_process):
    """The tokenizer registers with a Hello naming its role, protocol and a boot nonce."""
    _, side, hello = tokenizer_process
    assert (hello.role, hello.protocol_version) == ("tokenizer", PROTOCOL_VERSION)
    assert hello.boot_nonce and side.tokenizer_id.startswith(b"tokenizer-")
    assert side.from_tokenizer(Heartbeat).boot_nonce == hello.boot_nonce


def test_encode_job_gets_encoded_ids(tokenizer_process, tokenizer):
    """An EncodeJob is answered with Encoded: the tokenizer's ids, its DEALER identity as owner."""
    _, side, _ = tokenizer_process
    key = RequestKey(b"client-a", "e1")
    encoded = side.encode_job(key, "Hello world, how are you?", max_new_tokens=5)
    assert isinstance(encoded, Encoded)
    assert encoded.key == key and encoded.input_ids == tokenizer.encode("Hello world, how are you?")
    assert encoded.max_new_tokens == 5 and encoded.tokenizer_id == side.tokenizer_id


def test_too_long_prompt_is_rejected_with_tgis_message(tokenizer_process, tokenizer):
    """A prompt over --max-input-tokens gets Rejected with TGI's message, and the loop goes on."""
    _, side, _ = tokenizer_process
    text = "word " * 40
    rejected = side.encode_job(RequestKey(b"client-a", "long"), text, max_new_tokens=1)
    assert isinstance(rejected, Rejected)
    assert rejected.error == f"`inputs` must have less than 32 tokens. Given: {len(tokenizer.encode(text))}"
    assert rejected.error_type == "validation"
    assert isinstance(side.encode_job(RequestKey(b"client-a", "ok"), "short"), Encoded)


def test_detokenize_job_gets_one_text_batch(tokenizer_process, tokenizer):
    """One DetokenizeJob gets one TextBatch: one StreamEvents per client, the right texts, stop hits."""
    _, side, _ = tokenizer_process
    key_a, key_b = RequestKey(b"client-a", "d1"), RequestKey(b"client-b", "d1")
    side.encode_job(key_a, "Say hi", max_new_tokens=2)
    side.encode_job(key_b, "Say hi", max_new_tokens=2, stop=["!"])
    hello_id, bang_id = tokenizer.encode("Hello")[0], tokenizer.encode("!")[0]
    side.to_tokenizer(DetokenizeJob([TokenStep(key_a, Generation(0, hello_id, -0.5)),
                                     TokenStep(key_b, Generation(1, bang_id, -0.7))]))
    batch = side.from_tokenizer(TextBatch)
    client_to_events = {out.client_id: decode(out.payload, StreamEvents).events for out in batch.outputs}
    (event_a,), (event_b,) = client_to_events[b"client-a"], client_to_events[b"client-b"]
    assert (event_a.request_id, event_a.token.text, event_a.generated_text) == ("d1", "Hello", None)
    assert (event_b.generated_text, event_b.details.finish_reason) == ("!", "stop_sequence")
    assert batch.finished == [key_b]
    side.to_tokenizer(Forget([key_a]))
    side.to_tokenizer(DetokenizeJob([TokenStep(key_a, Generation(0, hello_id, -0.5))], job_id=7))
    assert side.from_tokenizer(TextBatch) == TextBatch(outputs=[], finished=[], job_id=7)  # answers job 7


def test_malformed_frames_do_not_kill_it(tokenizer_process):
    """Garbage, wrong message types and extra frames on both links are dropped; it keeps serving."""
    process, side, _ = tokenizer_process
    side.tokenize.send(b"\xc1 not msgpack")
    side.tokenize.send(encode(Heartbeat("x")))
    side.tokenize.send_multipart([b"a", b"b"])
    side.to_tokenizer(Hello("tokenizer", PROTOCOL_VERSION, "x"))
    side.detokenize.send_multipart([side.tokenizer_id, b"\x93\x01\x02"])
    side.detokenize.send_multipart([side.tokenizer_id, b"", b"extra"])
    assert isinstance(side.encode_job(RequestKey(b"client-a", "after"), "still alive"), Encoded)
    assert process.poll() is None


def test_new_scheduler_nonce_triggers_hello_again(tokenizer_process):
    """A heartbeat with a changed scheduler nonce makes the tokenizer register again."""
    _, side, hello = tokenizer_process
    side.to_tokenizer(Heartbeat("scheduler-1"))
    side.to_tokenizer(Heartbeat("scheduler-1"))
    side.to_tokenizer(Heartbeat("scheduler-2"))
    assert side.from_tokenizer(Hello).boot_nonce == hello.boot_nonce


def test_new_scheduler_drops_the_previous_ones_requests(tokenizer_process, tokenizer):
    """A new scheduler's first heartbeat drops the requests of the one before (their tokens will
    never come); a request the new one sent before that heartbeat is kept and served."""
    _, side, _ = tokenizer_process
    side.to_tokenizer(Heartbeat("generation-a"))
    side.from_tokenizer(Hello)
    old_key, new_key = RequestKey(b"client-old", "g1"), RequestKey(b"client-new", "g1")
    side.encode_job(old_key, "Say hi", "generation-a", max_new_tokens=2)
    side.encode_job(new_key, "Say hi", "generation-b", max_new_tokens=2)
    side.to_tokenizer(Heartbeat("generation-b"))
    side.from_tokenizer(Hello)
    hello_id = tokenizer.encode("Hello")[0]
    side.to_tokenizer(DetokenizeJob([TokenStep(old_key, Generation(0, hello_id, -0.5)),
                                     TokenStep(new_key, Generation(1, hello_id, -0.5))]))
    batch = side.from_tokenizer(TextBatch)
    assert [output.client_id for output in batch.outputs] == [b"client-new"]


def test_sigterm_exits_zero(tokenizer_process):
    """SIGTERM stops the loop, closes the sockets and exits 0 (runs last: it ends the process)."""
    process, _, _ = tokenizer_process
    assert stop_process(process, 10) == 0
