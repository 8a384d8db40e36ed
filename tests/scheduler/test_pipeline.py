"""Pipelined decode: the next Decode goes out behind the one in flight while nothing else is due
(the scheduler driven by encoded frames, no sockets)."""

from __future__ import annotations

from tests.scheduler.test_scheduler import CLIENT, WORKER_A, Harness
from ztgi.common import messages as m
from ztgi.common.codec import encode


def running(h: Harness, max_new_tokens: int = 10, *request_ids: str) -> tuple[list[int], list[object]]:
    """Requests prefilled together and answered: their ids and the commands that followed."""
    for request_id in request_ids or ("r1",):
        h.submit(request_id, max_new_tokens=max_new_tokens)
    (_, prefill), = h.step()
    rids = [r.seq_id for r in prefill.batch.requests]
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, rids)
    h.take("detokenize")
    return rids, [command for _, command in h.messages_to("workers")]


def test_next_decode_goes_out_behind_the_one_in_flight() -> None:
    """After a prefill: Decode and, behind it, the next Decode of the same batch; each answer brings
    one more, so the worker always has its next step waiting."""
    h = Harness(pipeline_decode=True)
    h.add_worker(WORKER_A)
    rids, commands = running(h)
    assert [type(c) for c in commands] == [m.Decode, m.Decode]
    assert commands[0].batch_ids == commands[1].batch_ids == [1]
    for _ in range(3):
        h.answer_step(WORKER_A, commands[0], 1, rids)
        [sent] = [command for _, command in h.messages_to("workers")]
        assert isinstance(sent, m.Decode) and sent.batch_ids == [1]
        commands = [commands[1], sent]
    assert len(h.scheduler.batcher.workers[WORKER_A].in_flight) == 2


def test_a_finished_request_waits_for_the_answer_in_flight_then_its_filter() -> None:
    """A request that finished stops the pipeline: the step in flight is answered (without it),
    then its Filter, then Decodes pipelined again."""
    h = Harness(pipeline_decode=True)
    h.add_worker(WORKER_A)
    rids, (first, second) = running(h, 10, "r1", "r2")
    h.answer_step(WORKER_A, first, 1, rids, finished={rids[0]: "length"})
    assert h.messages_to("workers") == []
    h.scheduler.on_worker_frame(WORKER_A, encode(m.StepResult(  # the worker still holds r1, stopped
        second.command_id, [m.Generation(rids[1], 7, -0.1, None, 3)], m.CachedBatch(1, rids, 100), m.Timings())))
    (_, filter_command), = h.messages_to("workers")
    assert isinstance(filter_command, m.Filter) and filter_command.seq_ids == rids[1:]
    h.scheduler.on_worker_frame(WORKER_A, encode(m.FilterResult(filter_command.command_id,
                                                           m.CachedBatch(1, rids[1:], 100))))
    assert [type(c) for _, c in h.messages_to("workers")] == [m.Decode, m.Decode]


def test_newcomers_due_for_admission_wait_for_the_answer_then_join() -> None:
    """With the queue due for admission nothing is pipelined: the answer comes back, the newcomer is
    prefilled, and the next Decode concatenates both batches."""
    h = Harness(pipeline_decode=True, waiting_served_ratio=0.0)
    h.add_worker(WORKER_A)
    rids, (first, second) = running(h)
    h.submit("r2")
    h.answer_step(WORKER_A, first, 1, rids)
    assert h.messages_to("workers") == []
    h.answer_step(WORKER_A, second, 1, rids)
    (_, prefill), = h.messages_to("workers")
    assert isinstance(prefill, m.Prefill)
    newcomer = prefill.batch.requests[0].seq_id
    h.answer_step(WORKER_A, prefill, prefill.batch.batch_id, [newcomer])
    decodes = [c for _, c in h.messages_to("workers")]
    assert [d.batch_ids for d in decodes] == [[1, prefill.batch.batch_id], [1]]


def test_an_empty_answer_for_a_batch_that_ended_moves_the_worker_on() -> None:
    """Every request finished in the step in flight: the pipelined Decode comes back empty and the
    worker prefills what waits, with no error for anyone."""
    h = Harness(pipeline_decode=True)
    h.add_worker(WORKER_A)
    rids, (first, second) = running(h, 2)
    h.submit("r2")
    h.scheduler.on_worker_frame(WORKER_A, encode(m.StepResult(
        first.command_id, [m.Generation(rids[0], 7, -0.1, "length", 2)], None, m.Timings())))
    h.take("detokenize")
    assert h.messages_to("workers") == []
    h.scheduler.on_worker_frame(WORKER_A, encode(m.StepResult(second.command_id, [], None, m.Timings())))
    (_, prefill), = h.messages_to("workers")
    assert isinstance(prefill, m.Prefill) and h.messages_to("frontend") == []


def test_tokens_of_a_cancelled_request_from_a_pipelined_step_are_dropped() -> None:
    """A request cancelled while two steps are in flight: their tokens never reach the tokenizer,
    and the batch is filtered once the worker has answered both."""
    h = Harness(pipeline_decode=True)
    h.add_worker(WORKER_A)
    rids, (first, second) = running(h, 10, "r1", "r2")
    h.scheduler.on_client_frame(CLIENT, encode(m.Cancel("r1")))
    h.take("detokenize")
    h.answer_step(WORKER_A, first, 1, rids)
    (_, job), = h.messages_to("detokenize")
    assert [step.key.request_id for step in job.steps] == ["r2"]
    assert h.messages_to("workers") == []
    h.answer_step(WORKER_A, second, 1, rids)
    (_, filter_command), = h.messages_to("workers")
    assert isinstance(filter_command, m.Filter) and filter_command.seq_ids == rids[1:]


def test_off_one_command_at_a_time() -> None:
    """`--no-pipeline-decode`: TGI's loop, one command in flight."""
    h = Harness(pipeline_decode=False)
    h.add_worker(WORKER_A)
    _, commands = running(h)
    assert [type(c) for c in commands] == [m.Decode]
