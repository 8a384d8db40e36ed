"""Scheduler: routing and TGI's batching loop, driven by encoded frames (no sockets)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from ztgi.common import messages as m
from ztgi.common.codec import decode, encode
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.scheduler import Scheduler

CLIENT = b"client-1"
TOKENIZER = b"tokenizer-1"
WORKER_A = b"worker-a"
WORKER_B = b"worker-b"
INFO = m.WorkerInfo("tiny", "float32", "cpu", [2], 100, 2048)


class Harness:
    """Plays every neighbour of the scheduler: a client, a tokenizer and workers."""

    def __init__(self, **config: object) -> None:
        """TGI's one command at a time unless a test asks for `pipeline_decode`."""
        defaults = dict(max_concurrent_requests=8, max_input_tokens=100, max_total_tokens=200,
                        max_batch_prefill_tokens=1000, pipeline_decode=False)
        defaults.update(config)
        self.scheduler = Scheduler(SchedulerConfig(**defaults), "nonce-1")
        self.tokenizer_hello()

    def take(self, socket: str) -> list[list[bytes]]:
        frames = list(getattr(self.scheduler.outbox, socket))
        getattr(self.scheduler.outbox, socket).clear()
        return frames

    def messages_to(self, socket: str) -> list[tuple[bytes | None, object]]:
        out = []
        for frames in self.take(socket):
            out.append((frames[0] if len(frames) == 2 else None, decode(frames[-1])))
        return out

    def tokenizer_hello(self) -> None:
        self.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t")))
        self.take("detokenize")

    def add_worker(self, identity: bytes, max_batch_total_tokens: int = 10_000) -> None:
        boot_nonce = f"nonce-of-{identity.decode()}"
        self.scheduler.on_worker_frame(identity, encode(m.Hello("worker", m.PROTOCOL_VERSION, boot_nonce, INFO)))
        (_, warmup), = self.messages_to("workers")
        assert isinstance(warmup, m.Warmup)
        self.scheduler.on_worker_frame(identity, encode(m.WarmupResult(warmup.command_id, max_batch_total_tokens)))

    def submit(self, request_id: str, num_input: int = 5, max_new_tokens: int = 3) -> None:
        """Client Generate, then the tokenizer's Encoded answer."""
        self.scheduler.on_client_frame(CLIENT, encode(m.Generate(request_id, "x", None, m.GenerateParameters())))
        jobs = [decode(f[0]) for f in self.take("tokenize")]
        assert [type(j) for j in jobs] == [m.EncodeJob]
        key = m.RequestKey(CLIENT, request_id)
        self.scheduler.on_tokenized_frame(encode(m.Encoded(key, list(range(10, 10 + num_input)),
                                                     m.SamplingParameters(), max_new_tokens, False, 0, False,
                                                     TOKENIZER)))

    def step(self) -> list[tuple[bytes, object]]:
        self.scheduler.schedule()
        return self.messages_to("workers")

    def answer_step(self, worker: bytes, command: object, batch_id: int, seq_ids: list[int],
                    finished: dict[int, str] | None = None) -> None:
        finished = finished or {}
        generations = [m.Generation(rid, 7, -0.1, finished.get(rid), 1) for rid in seq_ids]
        self.scheduler.on_worker_frame(worker, encode(m.StepResult(
            command.command_id, generations, m.CachedBatch(batch_id, seq_ids, 100), m.Timings())))


def test_request_flows_to_worker_and_tokens_to_tokenizer() -> None:
    """Generate -> EncodeJob -> queue -> Prefill; the step's tokens go to the owning tokenizer."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    (worker, prefill), = h.step()
    assert worker == WORKER_A and isinstance(prefill, m.Prefill)
    request = prefill.batch.requests[0]
    assert request.input_ids == [10, 11, 12, 13, 14] and request.max_new_tokens == 3
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [request.seq_id])
    (tokenizer, job), = h.messages_to("detokenize")
    assert tokenizer == TOKENIZER and isinstance(job, m.DetokenizeJob)
    assert job.steps[0].key == m.RequestKey(CLIENT, "r1") and job.steps[0].generation.token_id == 7
    (_, decode_cmd), = h.messages_to("workers")
    assert isinstance(decode_cmd, m.Decode) and decode_cmd.batch_ids == [prefill.batch.batch_id]


def test_finished_request_is_filtered_before_next_decode() -> None:
    """A finish from the worker makes the next command a Filter keeping the others."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.submit("r2")
    (_, prefill), = h.step()
    ids = [r.seq_id for r in prefill.batch.requests]
    h.answer_step(WORKER_A, prefill, 1, ids, finished={ids[0]: "length"})
    (_, filter_cmd), = h.messages_to("workers")
    assert isinstance(filter_cmd, m.Filter) and filter_cmd.seq_ids == [ids[1]]


def test_continuous_batching_prefills_newcomer_then_decodes_both() -> None:
    """A request arriving while a batch runs is prefilled, then one Decode covers both batches."""
    h = Harness(waiting_served_ratio=0.0)
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    first_id = prefill.batch.requests[0].seq_id
    h.submit("r2", max_new_tokens=10)
    h.answer_step(WORKER_A, prefill, 1, [first_id])
    (_, second_prefill), = h.messages_to("workers")
    assert isinstance(second_prefill, m.Prefill)
    second_id = second_prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, second_prefill, 2, [second_id])
    (_, decode_cmd), = h.messages_to("workers")
    assert isinstance(decode_cmd, m.Decode) and decode_cmd.batch_ids == [1, 2]


def test_waiting_served_ratio_defers_small_arrivals() -> None:
    """With a big running batch, one newcomer waits until max_waiting_tokens steps have passed."""
    h = Harness(waiting_served_ratio=1.0, max_waiting_tokens=3)
    h.add_worker(WORKER_A)
    for i in range(4):
        h.submit(f"r{i}", max_new_tokens=50)
    (_, command), = h.step()
    ids = [r.seq_id for r in command.batch.requests]
    h.submit("late", max_new_tokens=50)
    kinds = []
    for _ in range(4):
        h.answer_step(WORKER_A, command, 1, ids)
        h.take("detokenize")
        (_, command), = h.messages_to("workers")
        kinds.append(type(command).__name__)
    assert kinds == ["Decode", "Decode", "Prefill", "Decode"]


def test_overload_answers_at_once() -> None:
    """Beyond max_concurrent_requests the client gets an overloaded error event."""
    h = Harness(max_concurrent_requests=1)
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("a", "x", None, m.GenerateParameters())))
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("b", "x", None, m.GenerateParameters())))
    (client, reply), = h.messages_to("frontend")
    assert client == CLIENT and reply.events[0].request_id == "b"
    assert reply.events[0].error_type == "overloaded"


def test_cancel_running_request_filters_it() -> None:
    """Cancel removes a running request at the next step and tells its tokenizer to forget it."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.submit("r2")
    (_, prefill), = h.step()
    ids = [r.seq_id for r in prefill.batch.requests]
    h.scheduler.on_client_frame(CLIENT, encode(m.Cancel("r1")))
    (_, forget), = h.messages_to("detokenize")
    assert forget == m.Forget([m.RequestKey(CLIENT, "r1")])
    h.answer_step(WORKER_A, prefill, 1, ids)
    (_, job), = h.messages_to("detokenize")
    assert [s.key.request_id for s in job.steps] == ["r2"]
    (_, filter_cmd), = h.messages_to("workers")
    assert isinstance(filter_cmd, m.Filter) and filter_cmd.seq_ids == [ids[1]]


def test_stop_sequence_hit_from_tokenizer() -> None:
    """A TextBatch forwards payloads to clients untouched and its finished keys leave the batch."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, 1, [rid])
    (_, job), = h.messages_to("detokenize")
    (_, decode_cmd), = h.messages_to("workers")
    h.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.TextBatch(
        [m.ClientOutput(CLIENT, b"opaque")], [m.RequestKey(CLIENT, "r1")], job.job_id)))
    assert h.take("frontend") == [[CLIENT, b"opaque"]]
    h.answer_step(WORKER_A, decode_cmd, 1, [rid])
    assert h.messages_to("detokenize") == []  # the token after the hit is dropped
    (_, filter_cmd), = h.messages_to("workers")
    assert isinstance(filter_cmd, m.Filter) and filter_cmd.seq_ids == []


def test_worker_heartbeats_from_its_liveness_socket_keep_it() -> None:
    """A worker heartbeats from a second socket (another identity) with its boot nonce: that keeps
    it registered and is answered there; a heartbeat with a nonce nobody registered keeps no one."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=5)
    h.add_worker(WORKER_A)
    h.add_worker(WORKER_B)
    liveness = WORKER_A + b"/liveness"
    for worker in (WORKER_A, WORKER_B):
        h.scheduler.batcher.workers[worker].last_seen -= 10.0  # both silent for 10 s, twenty intervals
    h.scheduler.on_worker_frame(liveness, encode(m.Heartbeat(f"nonce-of-{WORKER_A.decode()}")))
    h.scheduler.on_worker_frame(b"stranger", encode(m.Heartbeat("nonce-of-nobody")))
    assert [(peer, type(msg)) for peer, msg in h.messages_to("workers")] == [
        (liveness, m.Heartbeat), (b"stranger", m.Heartbeat)]
    h.scheduler.tick(time.monotonic())
    assert WORKER_A in h.scheduler.batcher.workers and WORKER_B not in h.scheduler.batcher.workers
    assert b"stranger" not in h.scheduler.batcher.workers and liveness not in h.scheduler.batcher.workers


def test_dropped_worker_is_told_to_hello_again_and_serves_its_requests_once() -> None:
    """A worker silent past the window (frozen) is dropped and its request requeued; its heartbeats
    then hear `registered=False`; after its new Hello the request is prefilled again, and the
    frozen worker's late answer to the old prefill is dropped, not streamed."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=5)
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=5)
    (_, old_prefill), = h.step()
    h.scheduler.batcher.workers[WORKER_A].last_seen -= 10.0
    h.scheduler.tick(time.monotonic())
    assert WORKER_A not in h.scheduler.batcher.workers
    liveness = WORKER_A + b"/liveness"
    h.scheduler.on_worker_frame(liveness, encode(m.Heartbeat(f"nonce-of-{WORKER_A.decode()}")))
    assert h.messages_to("workers") == [(liveness, m.Heartbeat("nonce-1", False))]
    h.add_worker(WORKER_A)  # its Hello, the warmup
    (_, new_prefill), = h.step()
    assert isinstance(new_prefill, m.Prefill) and new_prefill.batch.requests == old_prefill.batch.requests
    rid = new_prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, old_prefill, 1, [rid])  # the frozen worker's late answer
    assert h.take("detokenize") == []
    h.answer_step(WORKER_A, new_prefill, 2, [rid])
    (_, job), = h.messages_to("detokenize")
    assert [step.generation.seq_id for step in job.steps] == [rid]
    h.scheduler.on_worker_frame(liveness, encode(m.Heartbeat(f"nonce-of-{WORKER_A.decode()}")))
    assert (liveness, m.Heartbeat("nonce-1", True)) in h.messages_to("workers")


def test_lost_worker_requests_resume_on_another() -> None:
    """A lost worker's request is prefilled on the other worker from prompt + tokens so far."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=5)
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, 1, [rid])
    h.take("workers")
    h.take("detokenize")
    h.add_worker(WORKER_B)
    h.scheduler.batcher.on_worker_lost(WORKER_A, "test")
    (worker, resumed), = h.step()
    assert worker == WORKER_B and isinstance(resumed, m.Prefill)
    request = resumed.batch.requests[0]
    assert request.input_ids == [10, 11, 12, 13, 14, 7] and request.max_new_tokens == 4


def test_worker_failure_fails_only_that_batch() -> None:
    """CommandFailed on a prefill fails its requests with a generation error; the scheduler goes on."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.submit("r1")
    (_, prefill), = h.step()
    h.scheduler.on_worker_frame(WORKER_A, encode(m.CommandFailed(prefill.command_id, "out of memory", [])))
    (client, reply), = h.messages_to("frontend")
    assert reply.events[0].error_type == "generation" and "out of memory" in reply.events[0].error
    h.submit("r2")
    (_, again), = h.step()
    assert isinstance(again, m.Prefill)


@pytest.mark.parametrize("frame", [b"", b"\x93garbage", encode(m.Decode(1, [1]))])
def test_bad_client_frame_gets_error_reply(frame: bytes) -> None:
    """Malformed or misdirected frames from a client get an ErrorReply and change nothing."""
    h = Harness()
    h.scheduler.on_client_frame(CLIENT, frame)
    (_, reply), = h.messages_to("frontend")
    assert isinstance(reply, m.ErrorReply)
    assert len(h.scheduler.table) == 0


def test_health_and_stats() -> None:
    """Health is false without a ready worker; Stats count queue and running requests."""
    h = Harness()
    h.scheduler.on_client_frame(CLIENT, encode(m.Query("q1", "health")))
    (_, health), = h.messages_to("frontend")
    assert health == m.HealthReply("q1", False, "no worker is ready")
    h.add_worker(WORKER_A)
    h.submit("r1")
    h.scheduler.on_client_frame(CLIENT, encode(m.Query("q2", "stats")))
    (_, stats), = h.messages_to("frontend")
    assert stats.num_queued == 1 and stats.num_running == 0 and stats.num_workers == 1


def test_data_parallel_workers_share_the_queue() -> None:
    """Two idle workers split waiting requests instead of one taking them all."""
    h = Harness()
    h.add_worker(WORKER_A)
    h.add_worker(WORKER_B)
    h.take("workers")
    for i in range(4):
        h.submit(f"r{i}")
    prefills = h.step()
    assert sorted(w for w, _ in prefills) == [WORKER_A, WORKER_B]
    assert [len(p.batch.requests) for _, p in prefills] == [2, 2]


def test_lost_tokenizer_encode_jobs_are_sent_again() -> None:
    """When a tokenizer goes silent, unanswered encode jobs are pushed again; a late duplicate is forgotten
    by the tokenizer that made it, never by the owner (which may have encoded the job twice)."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("r1", "x", None, m.GenerateParameters())))
    (job,) = h.take("tokenize")
    h.scheduler.tick(h.scheduler.tokenizers.last_seen[TOKENIZER] + 1.0)
    assert h.take("tokenize") == [job]
    key = m.RequestKey(CLIENT, "r1")
    answer = m.Encoded(key, [1], m.SamplingParameters(), 2, False, 0, False, b"tokenizer-2")
    h.scheduler.on_tokenized_frame(encode(answer))
    h.scheduler.on_tokenized_frame(encode(answer))  # the owner had the job twice: its state stays
    assert h.messages_to("detokenize") == []
    h.scheduler.on_tokenized_frame(encode(dataclasses.replace(answer, tokenizer_id=TOKENIZER)))  # the lost one, late
    assert h.messages_to("detokenize") == [(TOKENIZER, m.Forget([key]))] and len(h.scheduler.queue) == 1


def test_an_encode_job_pushed_as_a_tokenizer_dies_is_pushed_once_more() -> None:
    """A job pushed again when a tokenizer was lost can land in the dead one's pipe: unanswered a
    heartbeat window later, it is pushed once more (then it went to a live pipe)."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)  # a 0.2 s window
    h.scheduler.on_tokenizer_frame(b"tokenizer-2", encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t")))
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("r1", "x", None, m.GenerateParameters())))
    h.take("tokenize")
    h.scheduler.on_tokenizer_disconnected(b"tokenizer-2")
    assert len(h.take("tokenize")) == 1
    lost = h.scheduler.table.by_key(m.RequestKey(CLIENT, "r1")).encode_pushed_at
    pushes = []
    for after in (0.1, 0.3, 0.5, 0.8, 1.2, 1.7):
        h.scheduler.tokenizers.seen(TOKENIZER, lost + after, hello=False)  # the other one alive all along
        h.scheduler.tick(lost + after)
        pushes += [after] * len(h.take("tokenize"))
    assert pushes == [0.3]
    key = m.RequestKey(CLIENT, "r1")
    h.scheduler.on_tokenized_frame(encode(m.Encoded(key, [1], m.SamplingParameters(), 2, False, 0, False, TOKENIZER)))
    h.scheduler.tokenizers.seen(TOKENIZER, lost + 5.0, hello=False)
    h.scheduler.tick(lost + 5.0)
    assert h.take("tokenize") == [] and len(h.scheduler.queue) == 1


def test_a_slow_tokenizer_gets_no_copies_of_its_jobs() -> None:
    """With no tokenizer lost around its push, a job is never pushed again, however long it waits:
    an overloaded tokenizer is not handed its backlog twice."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)
    h.scheduler.on_client_frame(CLIENT, encode(m.Generate("r1", "x", None, m.GenerateParameters())))
    h.take("tokenize")
    pushed = h.scheduler.table.by_key(m.RequestKey(CLIENT, "r1")).encode_pushed_at
    for after in (0.3, 1.0, 5.0):
        h.scheduler.tokenizers.seen(TOKENIZER, pushed + after, hello=False)
        h.scheduler.tick(pushed + after)
    assert h.take("tokenize") == []


def test_lost_tokenizer_requests_are_adopted() -> None:
    """A lost tokenizer's request is adopted by another with the tokens its client has seen,
    and the unanswered steps are sent again to the adopter."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, 1, [rid])  # token 1 -> tokenizer-1
    (_, first_job), = h.messages_to("detokenize")
    h.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.TextBatch([], [], first_job.job_id)))  # token 1 acknowledged
    (_, decode_cmd), = h.messages_to("workers")
    h.answer_step(WORKER_A, decode_cmd, 1, [rid])  # token 2 -> never answered
    h.take("detokenize")
    h.scheduler.on_tokenizer_frame(b"tokenizer-2", encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t2")))
    h.take("detokenize")
    h.scheduler.tokenizers.last_seen[TOKENIZER] -= 10.0
    h.scheduler.tick(h.scheduler.tokenizers.last_seen[b"tokenizer-2"] + 0.1)
    sent = h.messages_to("detokenize")
    assert [(t, type(msg).__name__) for t, msg in sent] == [(b"tokenizer-2", "Adopt"),
                                                            (b"tokenizer-2", "DetokenizeJob")]
    adopt, job = sent[0][1], sent[1][1]
    assert adopt.emitted_ids == [7] and adopt.encoded.tokenizer_id == b"tokenizer-2"
    assert [s.generation.generated_tokens for s in job.steps] == [1]


def test_a_tokenizer_back_from_a_stall_streams_nothing_twice() -> None:
    """A tokenizer lost for silence (frozen) that resumes: its answer to a job handed to the
    adopter meanwhile is dropped, not streamed; it is told to forget the adopted request; the
    adopter's answer is streamed."""
    h = Harness(heartbeat_interval_ms=100, heartbeat_misses=2)
    h.add_worker(WORKER_A)
    h.submit("r1", max_new_tokens=10)
    (_, prefill), = h.step()
    rid = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, 1, [rid])
    (_, stale_job), = h.messages_to("detokenize")  # sent to tokenizer-1, which freezes
    h.scheduler.on_tokenizer_frame(b"tokenizer-2", encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t2")))
    h.take("detokenize")
    h.scheduler.tokenizers.last_seen[TOKENIZER] -= 10.0
    h.scheduler.tick(h.scheduler.tokenizers.last_seen[b"tokenizer-2"] + 0.1)
    (_, adopt), (_, resent_job) = h.messages_to("detokenize")
    key = m.RequestKey(CLIENT, "r1")
    stale = m.TextBatch([m.ClientOutput(CLIENT, b"token 1, stale")], [], stale_job.job_id)
    h.scheduler.on_tokenizer_frame(TOKENIZER, encode(stale))  # it resumes and answers the old job
    assert h.take("frontend") == []
    assert h.messages_to("detokenize") == [(TOKENIZER, m.Forget([key]))]
    fresh = m.TextBatch([m.ClientOutput(CLIENT, b"token 1")], [], resent_job.job_id)
    h.scheduler.on_tokenizer_frame(b"tokenizer-2", encode(fresh))
    assert h.take("frontend") == [[CLIENT, b"token 1"]]
    assert h.scheduler.table.by_key(key).num_acknowledged == 1
