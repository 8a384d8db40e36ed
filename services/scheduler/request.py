"""A request as the scheduler tracks it, from encode job to finish."""

from __future__ import annotations

import dataclasses
import enum
import time

from ztgi.common.messages import AdapterRef, Encoded, EncodedImage, GenerateParameters, RequestKey, WorkerRequest


class RequestStatus(enum.Enum):
    ENCODING = "encoding"   # sent to the tokenizer pool, no answer yet
    QUEUED = "queued"       # encoded, waiting for a batch
    RUNNING = "running"     # in a worker's cached batch


@dataclasses.dataclass(slots=True)
class Request:
    """Scheduler-side state; `seq_id` is the integer id workers see."""

    seq_id: int
    key: RequestKey
    status: RequestStatus = RequestStatus.ENCODING
    encoded: Encoded | None = None
    encode_job: bytes = b""  # kept until encoded: PUSH loses jobs queued for a tokenizer that dies
    encode_pushed_at: float = 0.0  # when `encode_job` was last pushed to the tokenizers
    parameters: GenerateParameters | None = None  # what another tokenizer needs to adopt it
    num_acknowledged: int = 0  # generated tokens whose text reached the client
    worker_id: bytes | None = None
    generated_ids: list[int] = dataclasses.field(default_factory=list)
    created_at: float = dataclasses.field(default_factory=time.monotonic)
    queued_at: float = 0.0
    prefill_started_at: float = 0.0
    num_resumed_tokens: int = 0  # tokens generated before the last (re)start on a worker
    # paged workers: the request's KV blocks on its worker, how many of them the worker was told
    # about, the input its (re)start prefills, and how many tokens have their KV computed
    block_ids: list[int] = dataclasses.field(default_factory=list)
    num_blocks_sent: int = 0
    prefill_len: int = 0
    num_computed: int = 0
    num_cached_tokens: int = 0  # prefix cache: input tokens its (re)start took from cached blocks
    num_indexed_blocks: int = 0  # prefix cache: its full blocks already given to the cache
    num_dropped_blocks: int = 0  # sliding-window workers: its first blocks, freed (sliding_window.py)
    adapter: AdapterRef | None = None  # the LoRA adapter it generates with (None: the base model)
    _prompt_cache_ids: list[int] | None = None  # `cache_tokens`' prompt part, computed once

    @property
    def cache_salt(self) -> int:
        """What its cached blocks are keyed by besides their tokens: the adapter's generation (0:
        the base), so that KV computed under one adapter is never reused under another."""
        return self.adapter.generation if self.adapter is not None else 0

    @property
    def tokens(self) -> list[int]:
        """Prompt + generated so far: what its KV blocks hold, in order."""
        assert self.encoded is not None
        return self.encoded.input_ids + self.generated_ids

    @property
    def cache_tokens(self) -> list[int]:
        """`tokens` as the prefix cache keys them: a prompt position inside an image's span holds
        a negative id drawn from the image's digest instead of its placeholder token, so that blocks
        covering two different images never match and the same image sent again does."""
        assert self.encoded is not None
        if not self.encoded.images:
            return self.tokens
        if self._prompt_cache_ids is None:
            self._prompt_cache_ids = image_keyed(self.encoded.input_ids, self.encoded.images)
        return self._prompt_cache_ids + self.generated_ids

    @property
    def image_bytes(self) -> int:
        """The bytes of its images' tensors: what it adds to the Prefill that starts it."""
        assert self.encoded is not None
        return sum(len(tensor.data) for image in self.encoded.images for tensor in image.tensors)

    @property
    def tokenizer_id(self) -> bytes:
        assert self.encoded is not None
        return self.encoded.tokenizer_id

    @property
    def input_length(self) -> int:
        """Tokens a prefill of this request reads: the prompt plus what was generated before."""
        assert self.encoded is not None
        return len(self.encoded.input_ids) + len(self.generated_ids)

    @property
    def is_prefilling(self) -> bool:
        """Paged: some of the input of its (re)start has no KV yet (chunked prefill goes on)."""
        return self.num_computed < self.prefill_len

    @property
    def total_tokens(self) -> int:
        """KV tokens the request needs at most: prompt + max_new_tokens."""
        assert self.encoded is not None
        return len(self.encoded.input_ids) + self.encoded.max_new_tokens

    def requeue(self, now: float) -> None:
        """Back to the queue, to resume from prompt + tokens so far; its blocks were freed."""
        self.status = RequestStatus.QUEUED
        self.queued_at = now  # no_worker_timeout_s counts from here, not from the first queueing
        self.worker_id = None
        self.num_resumed_tokens = len(self.generated_ids)
        self.block_ids = []
        self.num_blocks_sent = self.prefill_len = self.num_computed = self.num_indexed_blocks = 0
        self.num_dropped_blocks = 0

    def new_blocks(self) -> list[int]:
        """Blocks the worker has not been told about yet; from now on it has been."""
        blocks = self.block_ids[self.num_blocks_sent:]
        self.num_blocks_sent = len(self.block_ids)
        return blocks

    @property
    def remaining_new_tokens(self) -> int:
        assert self.encoded is not None
        return self.encoded.max_new_tokens - len(self.generated_ids)

    def to_worker(self, chunk_len: int | None = None) -> WorkerRequest:
        """The worker's view; a resumed request continues from prompt + tokens so far. On a paged
        worker it carries its blocks and the first prefill chunk."""
        encoded = self.encoded
        assert encoded is not None
        return WorkerRequest(
            seq_id=self.seq_id,
            input_ids=encoded.input_ids + self.generated_ids,
            sampling=encoded.sampling,
            max_new_tokens=self.remaining_new_tokens,
            ignore_eos=encoded.ignore_eos,
            top_n_tokens=encoded.top_n_tokens,
            prefill_logprobs=encoded.prefill_logprobs and not self.generated_ids,
            block_ids=self.new_blocks(),
            cache_len=self.num_computed,
            chunk_len=chunk_len,
            num_generated=len(self.generated_ids),
            embed=encoded.embed,
            adapter=self.adapter,
            images=encoded.images,
        )


def image_keyed(input_ids: list[int], images: list[EncodedImage]) -> list[int]:
    """The prompt with each image's span `[start, end)` filled with that image's key: a negative
    id (token ids are never negative) from the first 62 bits of its digest."""
    keyed = list(input_ids)
    for image in images:
        key = -1 - (int.from_bytes(image.digest[:8], "little") >> 2)
        keyed[image.start:image.end] = [key] * (image.end - image.start)
    return keyed
