"""The wire protocol: every message round-trips; every kind of bad frame raises MessageError."""

from __future__ import annotations

import math

import msgpack
import pytest

from ztgi.common import messages as m
from ztgi.common.codec import MAX_MESSAGE_BYTES, MessageError, decode, decode_frames, encode

KEY = m.RequestKey(b"client-1", "r1")
SAMPLING = m.SamplingParameters(temperature=0.7, top_k=5, do_sample=True, seed=42)
GENERATION = m.Generation(3, 17, -0.5, "length", 4, 42, [17, 9], [-0.5, -1.5], [1, 2], [math.nan, -2.0])
WORKER_INFO = m.WorkerInfo("smollm2", "float32", "cpu", [2], 49152, 8192)
CACHED = m.CachedBatch(7, [1, 2, 3], 300)
TOKEN = m.Token(17, "hi", -0.5, False)

SAMPLES = [
    m.Hello("worker", m.PROTOCOL_VERSION, "nonce", WORKER_INFO),
    m.Hello("tokenizer", m.PROTOCOL_VERSION, "nonce"),
    m.Heartbeat("nonce"),
    m.Generate("r1", "Hello", None, m.GenerateParameters(max_new_tokens=5, stop=["\n"], seed=3)),
    m.Generate("r2", None, [m.ChatMessage("user", "hi")], m.GenerateParameters()),
    m.Cancel("r1"),
    m.Query("q1", "stats"),
    m.Encoded(KEY, [1, 2, 3], SAMPLING, 10, False, 2, True, b"tok-1"),
    m.Rejected(KEY, "too long"),
    m.TextBatch([m.ClientOutput(b"client-1", b"payload")], [KEY]),
    m.StepResult(1, [GENERATION], CACHED, m.Timings(1, 2, 3, 6)),
    m.StepResult(2, [], None, m.Timings()),
    m.FilterResult(3, CACHED),
    m.WarmupResult(4, 100_000),
    m.CommandDone(5),
    m.CommandFailed(6, "boom", [1, 2]),
    m.EncodeJob(KEY, m.Generate("r1", "Hello", None, m.GenerateParameters())),
    m.DetokenizeJob([m.TokenStep(KEY, GENERATION)]),
    m.Forget([KEY]),
    m.Warmup(1, 4095, 4096, 4096, None),
    m.Prefill(2, m.Batch(1, [m.WorkerRequest(1, [1, 2], SAMPLING, 8, False, 0, False)], 10)),
    m.Decode(3, [1, 2]),
    m.Filter(4, 1, [2]),
    m.Clear(5, None),
    m.HealthCheck(6),
    m.StreamEvents([m.StreamEvent("r1", TOKEN, [TOKEN]),
                    m.StreamEvent("r1", TOKEN, generated_text="hi",
                                  details=m.FinalDetails("eos_token", 1, 3, None, [TOKEN]))]),
    m.HealthReply("q", True, "ok"),
    m.StatsReply("q", 1, 2, 1, 1, {"w": 2}, {"w": 5}, 10, 3),
    m.ErrorReply("bad"),
]


def _same(a: object, b: object) -> bool:
    """Equality that treats NaN as equal to NaN (prefill logprobs start with NaN)."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(msg: object) -> None:
    """Each message decodes back into an equal object of the same type."""
    decoded = decode(encode(msg))
    assert type(decoded) is type(msg)
    assert _same(decoded, msg)


def test_not_msgpack() -> None:
    """Garbage bytes are a MessageError, not a crash."""
    with pytest.raises(MessageError, match="msgpack"):
        decode(b"\xc1\xc1\xc1")


def test_truncated() -> None:
    """A truncated frame is a MessageError."""
    frame = encode(SAMPLES[3])
    with pytest.raises(MessageError):
        decode(frame[: len(frame) // 2])


def test_unknown_tag() -> None:
    """An unknown tag names itself in the error."""
    with pytest.raises(MessageError, match="unknown message tag 'nope'"):
        decode(msgpack.packb(["nope", 1]))


def test_wrong_arity() -> None:
    """A missing field is a MessageError naming the message."""
    with pytest.raises(MessageError, match="cancel: expected 1 fields, got 2"):
        decode(msgpack.packb(["cancel", "r1", "extra"]))


def test_wrong_type_names_field() -> None:
    """A wrongly typed field is rejected with its path."""
    with pytest.raises(MessageError, match=r"decode.batch_ids"):
        decode(msgpack.packb(["decode", 1, ["a"], []]))
    with pytest.raises(MessageError, match=r"heartbeat.boot_nonce: expected str"):
        decode(msgpack.packb(["heartbeat", 5, None, None, False]))


def test_bool_is_not_int() -> None:
    """A bool where an int is expected is rejected (msgpack keeps them apart, so do we)."""
    with pytest.raises(MessageError):
        decode(msgpack.packb(["command_done", True]))


def test_bad_literal() -> None:
    """A value outside a Literal set is rejected."""
    with pytest.raises(MessageError, match="is not one of"):
        decode(msgpack.packb(["query", "q", "reboot"]))


def test_post_init_validation() -> None:
    """Generate with both inputs and messages is rejected on decode."""
    with pytest.raises(MessageError, match="exactly one of inputs, messages and input_ids"):
        wire = msgpack.unpackb(encode(m.Generate("r", "x", None, m.GenerateParameters())))
        wire[3] = [["user", "hi", None, None, None]]
        decode(msgpack.packb(wire))


def test_not_an_array() -> None:
    """A frame that is a map or a bare value is a MessageError."""
    for frame in (msgpack.packb({"a": 1}), msgpack.packb(3), msgpack.packb([])):
        with pytest.raises(MessageError):
            decode(frame)


def test_oversized() -> None:
    """Frames over the limit are rejected before unpacking."""
    with pytest.raises(MessageError, match="exceeds"):
        decode(b"\x00" * (MAX_MESSAGE_BYTES + 1))


def test_expected_type() -> None:
    """A valid message of the wrong kind for a socket is rejected."""
    with pytest.raises(MessageError, match="unexpected message"):
        decode(encode(m.Cancel("r")), (m.Heartbeat,))


def test_unregistered_encode() -> None:
    """Encoding something that is not a message is a TypeError (a bug, not bad input)."""
    with pytest.raises(TypeError):
        encode(object())


def test_decode_frames() -> None:
    """A one-frame ZMQ message decodes to its checked message; any other frame count is a MessageError."""
    assert decode_frames([encode(m.Cancel("r"))], m.Cancel) == m.Cancel("r")
    for frames in ([], [encode(m.Cancel("r"))] * 2):
        with pytest.raises(MessageError, match="one-frame"):
            decode_frames(frames, m.Cancel)
    with pytest.raises(MessageError, match="unexpected message"):
        decode_frames([encode(m.Cancel("r"))], (m.Heartbeat,))
