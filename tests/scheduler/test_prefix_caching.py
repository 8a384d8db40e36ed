"""Prefix caching and cache-aware placement through the scheduler, with paged worker peers that check
every reused block holds the request's own tokens and choose each token from the blocks' content
(so a wrong reuse changes the answer)."""

from __future__ import annotations

import random

import pytest

from tests.scheduler.test_paged_batching import BLOCK_SIZE, PagedPeer, next_token
from tests.scheduler.test_scheduler import CLIENT, INFO, TOKENIZER
from ztgi.common import messages as m
from ztgi.common.codec import decode, encode
from ztgi.services.scheduler import paged_batcher
from ztgi.services.scheduler.config import SchedulerConfig
from ztgi.services.scheduler.scheduler import Scheduler


def expected_tokens(prompt: list[int], max_new: int) -> list[int]:
    """What the peers' 'model' answers with no cache at all."""
    tokens = list(prompt)
    for _ in range(max_new):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


class Harness:
    """A scheduler, a tokenizer identity and paged worker peers, stepped by hand."""

    def __init__(self, num_workers: int = 1, num_blocks: int | list[int] = 200, step_tokens: int = 64,
                 prefix_caching: bool = True, placement: str = "cache-aware") -> None:
        config = SchedulerConfig(max_concurrent_requests=128, max_input_tokens=100, max_total_tokens=200,
                                 prefix_caching=prefix_caching, placement=placement)
        self.scheduler = Scheduler(config, "nonce")
        self.scheduler.on_tokenizer_frame(TOKENIZER, encode(m.Hello("tokenizer", m.PROTOCOL_VERSION, "t")))
        self.peers: dict[bytes, PagedPeer] = {}
        pools = num_blocks if isinstance(num_blocks, list) else [num_blocks] * num_workers
        for i, pool in enumerate(pools):
            identity = f"worker-{i}".encode()
            self.peers[identity] = PagedPeer(pool, step_tokens)
            self.scheduler.on_worker_frame(identity, encode(m.Hello("worker", m.PROTOCOL_VERSION, f"w{i}", INFO)))
            warmup = decode(self.scheduler.outbox.workers.pop()[-1])
            self.scheduler.on_worker_frame(identity, encode(m.WarmupResult(
                warmup.command_id, pool * BLOCK_SIZE, pool, BLOCK_SIZE, step_tokens)))
        self.tokens: dict[str, list[int]] = {}
        self.cached: dict[str, int] = {}
        self.placed: dict[str, bytes] = {}  # the first worker each request was prefilled on
        self.placements: dict[str, list[bytes]] = {}  # every worker it was (re)started on, in order
        self.dead: set[bytes] = set()  # workers that answer nothing any more
        self.image_digests: dict[str, list[bytes]] = {}  # the images each request's last Prefill carried

    def submit(self, request_id: str, prompt: list[int], max_new: int, images: list[m.EncodedImage] = ()) -> None:
        key = m.RequestKey(CLIENT, request_id)
        self.scheduler.on_client_frame(CLIENT, encode(m.Generate(request_id, "x", None, m.GenerateParameters())))
        self.scheduler.on_tokenized_frame(encode(m.Encoded(key, list(prompt), m.SamplingParameters(), max_new, True, 0,
                                                     False, TOKENIZER, images=list(images))))
        self.scheduler.outbox.tokenize.clear()

    def cancel(self, request_id: str) -> None:
        self.scheduler.on_client_frame(CLIENT, encode(m.Cancel(request_id)))

    def step(self) -> bool:
        """Sends every command due and answers it; False when nothing was due."""
        self.scheduler.schedule()
        commands = [(frames[0], decode(frames[-1])) for frames in self.scheduler.outbox.workers]
        self.scheduler.outbox.workers.clear()
        for identity, command in commands:
            if identity in self.dead:
                continue
            if isinstance(command, m.Prefill):
                for r in command.batch.requests:
                    rid = self.scheduler.table.get(r.seq_id).key.request_id
                    self.placed.setdefault(rid, identity)
                    self.placements.setdefault(rid, []).append(identity)
                    self.image_digests[rid] = [image.digest for image in r.images]
            self.scheduler.on_worker_frame(identity, encode(self.peers[identity].run(command)))
        self._collect()
        return any(identity not in self.dead for identity, _ in commands)

    def kill(self, identity: bytes) -> None:
        """The worker dies: it answers nothing more, and the scheduler sees its connection close."""
        self.dead.add(identity)
        self.scheduler.on_worker_disconnected(identity)

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return

    def _collect(self) -> None:
        for frames in self.scheduler.outbox.detokenize:
            for step in getattr(decode(frames[-1]), "steps", []):
                rid = step.key.request_id
                self.tokens.setdefault(rid, []).append(step.generation.token_id)
                self.cached[rid] = step.cached_tokens
        self.scheduler.outbox.detokenize.clear()


DOCUMENT = [3 + (7 * i) % 50 for i in range(60)]


def test_shared_prefix_requests_reuse_the_cache_and_answer_as_without_it() -> None:
    """Requests sharing a document after the first: their prompts' shared blocks come from the
    cache (cached_tokens reported), and every answer equals the uncached one."""
    prompts = {f"q{i}": DOCUMENT + [60 + i, 61 + i, 62] for i in range(8)}
    harness = Harness()
    harness.submit("q0", prompts["q0"], 5)
    harness.run()
    for rid, prompt in list(prompts.items())[1:]:
        harness.submit(rid, prompt, 5)
    harness.run()
    assert harness.tokens == {rid: expected_tokens(p, 5) for rid, p in prompts.items()}
    assert harness.cached["q0"] == 0
    assert all(harness.cached[rid] == 60 for rid in list(prompts)[1:])
    assert harness.scheduler.metrics.prefix_cache_hit_tokens.values[()] == 7 * 60


def _image(digest: bytes, start: int, end: int, num_bytes: int = 8) -> m.EncodedImage:
    pixels = m.RawTensor("pixel_values", "float32", [num_bytes // 4], bytes(num_bytes))
    return m.EncodedImage(digest, start, end, end - start, [pixels])


def test_a_prefill_takes_images_up_to_what_one_message_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three image requests of 40 bytes each where a message holds 100 bytes of images: the first
    Prefill starts two, the third waits for the next step (a text request is not held back by it
    beyond that), and every request answers as without the limit."""
    monkeypatch.setattr(paged_batcher, "MAX_IMAGE_BYTES_PER_MESSAGE", 100)
    harness = Harness(step_tokens=1024)
    prompts = {f"image {i}": [10 + i] * 8 + DOCUMENT[:12] for i in range(3)}
    for i, (rid, prompt) in enumerate(prompts.items()):
        harness.submit(rid, prompt, 3, [_image(bytes([i]) * 16, 0, 8, num_bytes=40)])
    harness.step()
    assert set(harness.placements) == {"image 0", "image 1"}
    harness.run()
    assert harness.tokens == {rid: expected_tokens(prompt, 3) for rid, prompt in prompts.items()}


def test_blocks_covering_an_image_are_shared_only_with_the_same_image() -> None:
    """Two prompts of the same tokens, whose image spans hold the same placeholder ids but
    different images: the second shares only the blocks before the first span; the same image sent
    again shares every whole block, and the worker gets the images with the request."""
    prompt = DOCUMENT[:20] + [7] * 24 + DOCUMENT[20:40]  # an image's 24 placeholders at [20, 44): blocks 5-10
    harness = Harness()
    harness.submit("first", prompt, 3, [_image(b"a" * 16, 20, 44)])
    harness.run()
    harness.submit("other image", prompt, 3, [_image(b"b" * 16, 20, 44)])
    harness.run()
    harness.submit("same image", prompt, 3, [_image(b"a" * 16, 20, 44)])
    harness.run()
    assert harness.cached == {"first": 0, "other image": 20, "same image": (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE}
    assert harness.image_digests == {"first": [b"a" * 16], "other image": [b"b" * 16], "same image": [b"a" * 16]}


def test_a_burst_sharing_an_uncached_prefix_computes_it_once() -> None:
    """Eight requests with one new document arrive together, with room in the step for all: the
    first computes the document and the others wait for its blocks instead of computing them
    too (in-batch prefix check); a request sharing nothing is admitted at once beside the first.
    Every answer equals the uncached one."""
    prompts = {f"q{i}": DOCUMENT + [60 + i, 61 + i, 62] for i in range(8)}
    other = [90 - (i % 40) for i in range(40)]
    harness = Harness(step_tokens=1024)
    for rid, prompt in prompts.items():
        harness.submit(rid, prompt, 5)
    harness.submit("other", other, 5)
    harness.step()
    assert set(harness.placements) == {"q0", "other"}
    harness.run()
    assert harness.tokens == {**{rid: expected_tokens(p, 5) for rid, p in prompts.items()},
                              "other": expected_tokens(other, 5)}
    full_blocks = (len(prompts["q1"]) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert harness.cached["q0"] == harness.cached["other"] == 0
    assert all(harness.cached[rid] == full_blocks for rid in list(prompts)[1:])


def test_a_prefix_too_short_to_share_does_not_hold_a_request_back() -> None:
    """Sharing less than two uncached blocks is not worth a wait: both are admitted together."""
    shared = DOCUMENT[:BLOCK_SIZE + 2]  # one full block and a bit
    harness = Harness(step_tokens=1024)
    harness.submit("a", shared + [1, 2, 3], 3)
    harness.submit("b", shared + [4, 5, 6], 3)
    harness.step()
    assert set(harness.placements) == {"a", "b"}
    harness.run()
    assert harness.tokens["b"] == expected_tokens(shared + [4, 5, 6], 3)


def test_without_prefix_caching_every_prompt_is_computed() -> None:
    """--no-prefix-caching: the same requests, no cached tokens, the same answers."""
    prompts = {f"q{i}": DOCUMENT + [60 + i] for i in range(4)}
    harness = Harness(prefix_caching=False)
    for rid, prompt in prompts.items():
        harness.submit(rid, prompt, 4)
        harness.run()
    assert harness.tokens == {rid: expected_tokens(p, 4) for rid, p in prompts.items()}
    assert set(harness.cached.values()) == {0}


def test_the_next_chat_turn_reuses_the_previous_prompt_and_answer() -> None:
    """Multi-turn: turn 2's prompt is turn 1's prompt + answer + a new message; the blocks of all
    the tokens turn 1 computed (its last token has no KV yet) are reused."""
    harness = Harness()
    turn1 = DOCUMENT[:21]
    harness.submit("t1", turn1, 12)
    harness.run()
    turn2 = turn1 + harness.tokens["t1"] + [70, 71, 72]
    harness.submit("t2", turn2, 6)
    harness.run()
    computed_by_turn1 = len(turn1) + 12 - 1
    assert harness.cached["t2"] == computed_by_turn1 // BLOCK_SIZE * BLOCK_SIZE
    assert harness.tokens["t2"] == expected_tokens(turn2, 6)


def test_churn_with_cancellations_preemptions_and_evictions_answers_as_uncached() -> None:
    """A small pool, shared and unique prompts arriving over time, cancellations: every request
    that finishes answers exactly its uncached greedy tokens; blocks were evicted and requests
    preempted on the way, and every block is free at the end."""
    rng = random.Random(18)
    harness = Harness(num_blocks=40, step_tokens=48)
    prefixes = [[rng.randrange(3, 90) for _ in range(rng.choice((8, 13, 24)))] for _ in range(3)]
    prompts: dict[str, list[int]] = {}
    max_new: dict[str, int] = {}
    cancelled: set[str] = set()
    for i in range(60):
        rid = f"r{i}"
        shared = rng.random() < 0.7
        prompts[rid] = ((rng.choice(prefixes) if shared else [])
                        + [rng.randrange(3, 90) for _ in range(rng.randrange(1, 12))])
        max_new[rid] = rng.randrange(1, 30)
        harness.submit(rid, prompts[rid], max_new[rid])
        for _ in range(rng.randrange(0, 4)):
            harness.step()
        if i > 3 and rng.random() < 0.15:
            victim = f"r{rng.randrange(i)}"
            cancelled.add(victim)
            harness.cancel(victim)
    harness.run()
    finished = {rid for rid in prompts if rid not in cancelled}
    for rid in finished:
        assert harness.tokens[rid] == expected_tokens(prompts[rid], max_new[rid]), rid
    slot, = harness.scheduler.batcher.workers.values()
    assert slot.allocator.num_evictions > 0 and harness.scheduler.metrics.preemptions.values
    assert sum(harness.cached.values()) > 0
    assert slot.allocator.num_free == 40 and len(harness.scheduler.table) == 0


def test_two_workers_two_prefixes_each_request_goes_to_the_worker_holding_its_prefix() -> None:
    """Two shared prefixes interleaved over two workers: at least 90% of requests run where their
    prefix is, and both workers serve."""
    harness = Harness(num_workers=2, num_blocks=300)
    documents = [DOCUMENT, [90 - t for t in DOCUMENT]]
    for i in range(40):
        harness.submit(f"d{i % 2}-{i}", documents[i % 2] + [5 + i], 3)
        harness.step()
    harness.run()
    holder = {d: harness.placed[f"d{d}-{d}"] for d in (0, 1)}
    on_holder = sum(harness.placed[rid] == holder[int(rid[1])] for rid in harness.placed)
    assert holder[0] != holder[1] and on_holder >= 0.9 * len(harness.placed)
    assert all(harness.tokens[f"d{i % 2}-{i}"] == expected_tokens(documents[i % 2] + [5 + i], 3) for i in range(40))
