"""Scheduler: /tokenize queries routed to a connected tokenizer and answered back (no sockets)."""

from __future__ import annotations

import time

from tests.scheduler.test_scheduler import CLIENT, TOKENIZER, Harness
from ztgi.common import messages as m
from ztgi.common.codec import decode, encode

TOKENIZER_2 = b"tokenizer-2"


def ask(h: Harness, query_id: str = "q1", inputs: str = "Hello world") -> None:
    h.scheduler.on_client_frame(CLIENT, encode(m.TokenizeQuery(query_id, inputs, False, 4)))


def jobs_by_tokenizer(h: Harness) -> list[tuple[bytes, m.TokenizeJob]]:
    return [(t, msg) for t, msg in h.messages_to("detokenize") if isinstance(msg, m.TokenizeJob)]


def reply_to_client(h: Harness) -> m.TokenizeReply:
    (client, reply), = [(c, msg) for c, msg in h.messages_to("frontend") if isinstance(msg, m.TokenizeReply)]
    assert client == CLIENT
    return reply


def test_query_goes_to_a_tokenizer_and_its_answer_to_the_client_untouched() -> None:
    """TokenizeQuery -> TokenizeJob on `detokenize`; TokenizeDone's payload reaches the client as sent."""
    h = Harness()
    ask(h)
    (tokenizer, job), = jobs_by_tokenizer(h)
    assert tokenizer == TOKENIZER and job.query == m.TokenizeQuery("q1", "Hello world", False, 4)
    payload = encode(m.TokenizeReply("q1", [m.SimpleToken(19556, "Hello", 0, 5)]))
    h.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.TokenizeDone(job.job_id, payload)))
    (client, frame), = h.take("frontend")
    assert client == CLIENT and frame == payload
    h.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.TokenizeDone(job.job_id, payload)))  # a duplicate: dropped
    assert h.take("frontend") == []


def test_no_tokenizer_is_an_unhealthy_error_at_once() -> None:
    """With no tokenizer connected the client gets an error reply, not silence."""
    h = Harness()
    h.scheduler.tokenizers.last_seen.clear()
    ask(h)
    reply = reply_to_client(h)
    assert reply.query_id == "q1" and reply.error_type == "unhealthy" and "No tokenizer" in reply.error


def test_jobs_spread_over_tokenizers() -> None:
    """Two queries in flight go to two different tokenizers."""
    h = Harness()
    h.scheduler.on_tokenizer_frame(TOKENIZER_2, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t2")))
    h.take("detokenize")
    ask(h, "q1")
    ask(h, "q2")
    assert {tokenizer for tokenizer, _ in jobs_by_tokenizer(h)} == {TOKENIZER, TOKENIZER_2}


def test_lost_tokenizer_job_goes_to_another_or_fails() -> None:
    """A silent tokenizer's job is sent to the live one; with none left, the client gets an error."""
    h = Harness(heartbeat_interval_ms=10, heartbeat_misses=2)
    ask(h, "q1")
    (first, job), = jobs_by_tokenizer(h)
    time.sleep(0.05)
    h.scheduler.on_tokenizer_frame(TOKENIZER_2, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t2")))
    h.scheduler.tick(time.monotonic())
    (second, resent), = jobs_by_tokenizer(h)
    assert (first, second) == (TOKENIZER, TOKENIZER_2) and resent == job
    time.sleep(0.05)
    h.scheduler.tick(time.monotonic())
    reply = reply_to_client(h)
    assert reply.query_id == "q1" and reply.error_type == "unhealthy"


def test_client_tokenize_reply_round_trips() -> None:
    """TokenizeReply decodes back to the same tokens (what the client library reads)."""
    reply = m.TokenizeReply("q", [m.SimpleToken(1, "a", 0, 1), m.SimpleToken(2, "", 0, 0)])
    assert decode(encode(reply)) == reply
