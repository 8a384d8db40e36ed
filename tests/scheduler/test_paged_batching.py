"""Paged batching in the scheduler: block tables, the per-step token budget, chunked prefill,
preemption and prefix caching, driven through the scheduler by a worker peer that keeps the books a
paged worker keeps (which blocks each request holds, which tokens each block slot holds, how many
of a request's tokens have KV) and checks every command."""

from __future__ import annotations

import dataclasses

from tests.scheduler.test_scheduler import CLIENT, INFO, TOKENIZER
from ztgi.common import messages as m
from ztgi.common.codec import decode, encode
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.scheduler import Scheduler

WORKER = b"paged-worker"
BLOCK_SIZE = 4


@dataclasses.dataclass
class Seq:
    tokens: list[int]  # input + generated so far
    prefill_len: int
    computed: int
    blocks: list[int]
    chunk: int | None
    remaining: int


def next_token(tokens: list[int]) -> int:
    """The peer's 'model': a deterministic function of the whole context (as greedy decoding is),
    so a request whose reused blocks held other tokens would answer differently."""
    return 10 + sum((i + 1) * t for i, t in enumerate(tokens)) % 89


class PagedPeer:
    """The worker side: applies Prefill/Decode/Filter as a paged worker does and asserts what a
    paged worker would get wrong: a block written while another request holds it, cached KV
    (`cache_len`) that is not the request's own tokens, a step beyond its blocks or over budget.
    Each token's 'KV' is the token id written in its slot; a token is chosen from the slots."""

    def __init__(self, num_blocks: int, step_tokens: int, refuse: int | None = None) -> None:
        self.num_blocks, self.step_tokens, self.refuse = num_blocks, step_tokens, refuse
        self.seqs: dict[int, Seq] = {}
        self.slots: dict[tuple[int, int], int] = {}  # (block, offset) -> the token whose KV it holds
        self.batch_id: int | None = None
        self.max_running = 0
        self.chunked_steps = 0
        self.cached_tokens = 0

    def run(self, command: object) -> object:
        match command:
            case m.Prefill():
                refused = [r.seq_id for r in command.batch.requests if r.seq_id == self.refuse]
                if refused:  # bad input: refused before anything changes, as the engine does
                    return m.CommandFailed(command.command_id, "request outside the vocabulary",
                                           [r.seq_id for r in command.batch.requests])
                for r in command.batch.requests:
                    assert 0 <= r.cache_len < len(r.input_ids), f"request {r.seq_id}: cache_len {r.cache_len}"
                    assert [self.slots.get(self._slot(r.block_ids, p)) for p in range(r.cache_len)] == \
                        r.input_ids[:r.cache_len], f"request {r.seq_id} reuses blocks holding other tokens"
                    self.cached_tokens += r.cache_len
                    self.seqs[r.seq_id] = Seq(list(r.input_ids), len(r.input_ids), r.cache_len,
                                                  list(r.block_ids), r.chunk_len, r.max_new_tokens)
                self.batch_id = command.batch_ids[0] if command.batch_ids else command.batch.batch_id
                return self._step(command.command_id, command.updates)
            case m.Decode():
                return self._step(command.command_id, command.updates)
            case m.Filter():
                self.seqs = {rid: s for rid, s in self.seqs.items() if rid in command.seq_ids}
                return m.FilterResult(command.command_id, self._cached())
        raise AssertionError(f"unexpected {command}")

    @staticmethod
    def _slot(blocks: list[int], position: int) -> tuple[int, int]:
        return blocks[position // BLOCK_SIZE], position % BLOCK_SIZE

    def _write(self, rid: int, seq: Seq, start: int, count: int) -> None:
        """Stores the tokens' 'KV'; no other request may hold a block being written."""
        for position in range(start, start + count):
            block, offset = self._slot(seq.blocks, position)
            holders = [other for other, s in self.seqs.items() if other != rid and block in s.blocks]
            assert not holders, f"request {rid} writes block {block} that requests {holders} hold"
            self.slots[block, offset] = seq.tokens[position]

    def _cached(self) -> m.CachedBatch | None:
        return m.CachedBatch(self.batch_id, list(self.seqs), 0) if self.seqs else None

    def _step(self, command_id: int, updates: list[m.SeqUpdate]) -> m.StepResult:
        for update in updates:
            self.seqs[update.seq_id].blocks += update.new_block_ids
            self.seqs[update.seq_id].chunk = update.chunk_len
        held = [b for s in self.seqs.values() for b in s.blocks]
        assert all(0 <= b < self.num_blocks for b in held)
        assert all(len(set(s.blocks)) == len(s.blocks) for s in self.seqs.values())
        self.max_running = max(self.max_running, len(self.seqs))
        generations, num_tokens = [], 0
        for rid, seq in list(self.seqs.items()):
            if seq.remaining == 0:
                continue
            prefilling = seq.computed < seq.prefill_len
            count = (min(seq.chunk, seq.prefill_len - seq.computed) if seq.chunk else seq.prefill_len - seq.computed) \
                if prefilling else 1
            if prefilling and seq.chunk == 0:
                continue
            assert len(seq.blocks) * BLOCK_SIZE >= seq.computed + count, f"request {rid} beyond its blocks"
            self.chunked_steps += prefilling and seq.computed + count < seq.prefill_len
            self._write(rid, seq, seq.computed, count)
            seq.computed += count
            num_tokens += count
            if prefilling and seq.computed < seq.prefill_len:
                seq.chunk = 0
                continue
            context = [self.slots[self._slot(seq.blocks, p)] for p in range(seq.computed)]
            token = next_token(context)
            seq.tokens.append(token)
            seq.remaining -= 1
            generations.append(m.Generation(rid, token, -0.1, "length" if seq.remaining == 0 else None, 1))
        assert num_tokens <= self.step_tokens, f"{num_tokens} tokens over the step budget"
        return m.StepResult(command_id, generations, self._cached(), m.Timings())


def _run(requests: list[tuple[int, int]], num_blocks: int, step_tokens: int = 64,
         refuse: int | None = None) -> tuple[PagedPeer, Scheduler, dict]:
    """Submits (input tokens, max_new_tokens) requests and runs until every one finished."""
    config = SchedulerConfig(max_concurrent_requests=128, max_input_tokens=100, max_total_tokens=200)
    scheduler = Scheduler(config, "nonce")
    scheduler.on_tokenizer_frame(TOKENIZER, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t")))
    scheduler.on_worker_frame(WORKER, encode(m.Hello("worker", m.PROTOCOL_VERSION, "w", INFO)))
    peer = PagedPeer(num_blocks, step_tokens, refuse)
    warmup = decode(scheduler.outbox.workers.pop()[-1])
    scheduler.on_worker_frame(WORKER, encode(m.WarmupResult(warmup.command_id, num_blocks * BLOCK_SIZE, num_blocks,
                                                      BLOCK_SIZE, step_tokens)))
    for i, (num_input, max_new) in enumerate(requests):
        if i == len(requests) - 1 and refuse is not None:  # the last one arrives while others run
            for _ in range(3):
                scheduler.schedule()
                commands = [decode(frames[-1]) for frames in scheduler.outbox.workers]
                scheduler.outbox.workers.clear()
                for command in commands:
                    scheduler.on_worker_frame(WORKER, encode(peer.run(command)))
        key = m.RequestKey(CLIENT, f"r{i}")
        scheduler.on_client_frame(CLIENT, encode(m.Generate(key.request_id, "x", None, m.GenerateParameters())))
        prompt = list(range(10 + i, 10 + i + num_input))  # prompts part at their first token: no shared prefix
        scheduler.on_tokenized_frame(encode(m.Encoded(key, prompt, m.SamplingParameters(),
                                                max_new, False, 0, False, TOKENIZER)))
    scheduler.outbox.tokenize.clear()
    generated: dict[str, int] = {}
    for _ in range(10_000):
        scheduler.schedule()
        commands = [decode(frames[-1]) for frames in scheduler.outbox.workers]
        scheduler.outbox.workers.clear()
        _count_tokens(scheduler, generated)
        if not commands:
            break
        for command in commands:
            scheduler.on_worker_frame(WORKER, encode(peer.run(command)))
    _count_tokens(scheduler, generated)
    return peer, scheduler, generated


def _count_tokens(scheduler: Scheduler, generated: dict[str, int]) -> None:
    for frames in scheduler.outbox.detokenize:
        job = decode(frames[-1])
        for step in getattr(job, "steps", []):  # DetokenizeJobs (heartbeats aside)
            generated[step.key.request_id] = generated.get(step.key.request_id, 0) + 1
    scheduler.outbox.detokenize.clear()


def test_every_request_finishes_within_blocks_and_budget() -> None:
    """Mixed prompts, a pool that holds them all: each request generates all its tokens, no block
    is ever held twice, no step exceeds its token budget, and long prompts are chunked."""
    requests = [(5 + 17 * i % 90, 3 + i % 5) for i in range(12)]
    peer, scheduler, generated = _run(requests, num_blocks=400, step_tokens=64)
    assert generated == {f"r{i}": new for i, (_, new) in enumerate(requests)}
    assert peer.chunked_steps > 0 and len(scheduler.table) == 0
    slot, = scheduler.batcher.workers.values()
    assert slot.allocator.num_free == 400


def test_a_small_pool_preempts_and_everyone_finishes() -> None:
    """A pool too small for all requests at once: the newest running request is preempted and
    requeued, and every request still generates exactly its tokens (nothing lost, none twice)."""
    requests = [(20, 30) for _ in range(10)]
    peer, scheduler, generated = _run(requests, num_blocks=40, step_tokens=64)
    assert generated == {f"r{i}": 30 for i in range(10)}
    assert scheduler.batcher.metrics.preemptions.to_message().samples
    slot, = scheduler.batcher.workers.values()
    assert slot.allocator.num_free == 40


def test_a_request_larger_than_any_pool_is_refused_at_admission() -> None:
    """A request needing more KV than the pool holds gets a validation error naming the limit."""
    scheduler = Scheduler(SchedulerConfig(max_input_tokens=100, max_total_tokens=200), "nonce")
    scheduler.on_tokenizer_frame(TOKENIZER, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t")))
    scheduler.on_worker_frame(WORKER, encode(m.Hello("worker", m.PROTOCOL_VERSION, "w", INFO)))
    warmup = decode(scheduler.outbox.workers.pop()[-1])
    scheduler.on_worker_frame(WORKER, encode(m.WarmupResult(warmup.command_id, 64, 16, BLOCK_SIZE, 64)))
    key = m.RequestKey(CLIENT, "big")
    scheduler.on_client_frame(CLIENT, encode(m.Generate("big", "x", None, m.GenerateParameters())))
    scheduler.on_tokenized_frame(encode(m.Encoded(key, list(range(60)), m.SamplingParameters(), 10, False, 0, False,
                                            TOKENIZER)))
    events = [decode(frames[-1]) for frames in scheduler.outbox.frontend]
    error = events[-1].events[0]
    assert error.error_type == "validation" and "64 tokens" in error.error and len(scheduler.table) == 0


def test_refused_newcomers_fail_alone_and_the_running_requests_go_on() -> None:
    """The worker refuses a joined Prefill's newcomer (bad input, nothing applied): only it fails,
    and the running requests, whose block updates rode on that Prefill, finish all their tokens."""
    requests = [(6, 12), (9, 12), (5, 4)]
    peer, scheduler, generated = _run(requests, num_blocks=64, step_tokens=64, refuse=3)
    assert generated == {"r0": 12, "r1": 12}
    errors = [e for frames in scheduler.outbox.frontend for e in decode(frames[-1]).events if e.error]
    assert [e.request_id for e in errors] == ["r2"] and errors[0].error_type == "generation"
    slot, = scheduler.batcher.workers.values()
    assert slot.allocator.num_free == 64
