"""`LLM`: offline batch inference in this process, vLLM's `LLM.generate` and `LLM.chat`.

The server's parts, in one process: the tokenizer service's `Encoder` (chat template, limits,
parameter resolution) turns each prompt into the `Encoded` request a scheduler queues, a
`LocalEngine` (the scheduler's batching loop over the worker's engine) runs them all together,
and the tokenizer service's `Detokenizer` turns each step's tokens into text and finds stop
strings, as it does for a server's clients. So an offline run batches, samples, stops and
decodes text exactly as `ztgi launch` serves the same requests.

    llm = LLM()                                              # the embedded SmolLM2
    for output in llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=20)):
        print(output.outputs[0].text)
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import gc
import itertools
import logging
import struct
import time
from collections.abc import Sequence
from typing import Any

from ztgi.common.gc_freeze import freeze_startup_objects
from ztgi.common.messages import (
    AdapterRef,
    Encoded,
    EncodedImage,
    Generate,
    GenerateParameters,
    Generation,
    RequestKey,
    TokenStep,
)
from ztgi.common.model_source import DEFAULT_MODEL_ID
from ztgi.common.parameters import ParameterLimits, ValidationError
from ztgi.engine_options import EngineOptions
from ztgi.local_engine import LocalEngine
from ztgi.lora_request import LoRARequest
from ztgi.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestMetrics, RequestOutput
from ztgi.progress import Progress
from ztgi.prompts import Prompt, as_conversations, as_prompts, per_prompt
from ztgi.sampling_params import MAX_LOGPROBS, SamplingParams
from ztgi.sequence import Sequence as GeneratedSequence
from ztgi.services.tokenizer.detokenizer import Detokenizer
from ztgi.services.tokenizer.encoder import Encoder
from ztgi.services.tokenizer.loading import load_tokenizer, load_vision_processor
from ztgi.services.worker.config import DEVICES, DTYPES, KV_CACHES
from ztgi.services.worker.model_loader import load_model
from ztgi.tensor_parallel import OfflineGroup

logger = logging.getLogger(__name__)

CLIENT_ID = b"llm"  # every offline request's key: (this, "<request id>/<sequence index>")
MAX_STOP_STRINGS = 2**16  # no server-side cap on stop strings offline


@dataclasses.dataclass
class _Request:
    """One prompt's request: its ids, its parameters and its `n` sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    sequences: list[GeneratedSequence]
    num_unfinished: int = 0
    metrics: RequestMetrics = dataclasses.field(default_factory=lambda: RequestMetrics(time.monotonic()))

    def to_output(self) -> RequestOutput:
        prompt_logprobs = self.sequences[0].prompt_logprobs
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, prompt_logprobs,
                             [sequence.to_output() for sequence in self.sequences], metrics=self.metrics)


class LLM:
    """A model loaded in this process with the server's engine and batching.

    `model`: `smollm2` (the embedded SmolLM2-135M-Instruct), a model directory, a .gguf file or a
    Hub id; `dtype` float32, bfloat16, float16 or auto; `device` cpu, cuda or auto; `backend`
    native, transformers or auto. `engine_options` are the server's batching limits by its flag
    names (`max_total_tokens`, `max_input_tokens`, `max_batch_prefill_tokens`,
    `max_batch_total_tokens`, `max_batch_size`, `waiting_served_ratio`, `max_waiting_tokens`,
    `pipeline_decode`, `prefix_caching`: True by default, prompts that start alike share the KV
    blocks of what they share) and the worker's (`kv_cache` paged, padded or auto; `block_size`,
    `step_target_ms`, `memory_budget_mb`, `cpu_warmup_prefill_tokens`: where not given, the workers'
    `ZTGI_CPU_WARMUP_PREFILL_TOKENS` or 512; `speculate`, `draft_model_id`
    or `draft_model`: a small model with the same tokenizer that proposes the `speculate` tokens,
    `quantize` auto, gguf, none, int8 or int4 with `quantized_max_rows`: as `ztgi worker --quantize`),
    or vLLM's for the same limit (`max_model_len`, `max_num_seqs`, `max_num_batched_tokens`,
    `num_speculative_tokens`, `speculative_model`, `enable_prefix_caching`).
    """

    def __init__(self, model: str = DEFAULT_MODEL_ID, dtype: str = "auto", device: str = "auto",
                 backend: str = "auto", **engine_options: Any) -> None:
        options = EngineOptions.parse(engine_options)
        dtype, device = _checked("dtype", dtype, DTYPES), _checked("device", device, DEVICES)
        group = OfflineGroup(model, dtype, device, backend, options) if options.num_shard > 1 else None
        self._group = group
        if group is not None:
            self.model = group.load()
        else:
            self.model = load_model(model, dtype, device, backend, _checked("kv_cache", options.kv_cache, KV_CACHES),
                                    options.block_size, quantize=options.quantize, speculate=options.speculate,
                                    draft_model_id=options.draft_model_id,
                                    quantized_max_rows=options.quantized_max_rows)
        config = options.scheduler_config(self.model)
        self.tokenizer = load_tokenizer(model)
        limits = ParameterLimits(max_best_of=1, max_stop_sequences=MAX_STOP_STRINGS, max_top_n_tokens=MAX_LOGPROBS,
                                 max_input_tokens=config.max_input_tokens, max_total_tokens=config.max_total_tokens)
        vision = load_vision_processor(model, self.tokenizer)  # a vision-language model's images: as a server's
        self.encoder = Encoder(self.tokenizer, limits, CLIENT_ID, vision, model_name=model)
        self.detokenizer = Detokenizer(self.tokenizer)
        # a group's ranks share the KV budget, as a worker group's do
        self.engine = LocalEngine(self.model, config, max(1, options.memory_budget_mb // options.num_shard),
                                  options.cpu_warmup_prefill_tokens, options.step_target_ms,
                                  relay=group.relay if group is not None else None)
        self._request_counter = itertools.count()
        freeze_startup_objects()  # the weights and the vocabulary stay out of later GC passes, as in the services
        _unfreeze_at_exit()

    def close(self) -> None:
        """Stops the other ranks of a `tensor_parallel_size` group now (they stop at exit anyway)."""
        if self._group is not None:
            self._group.stop()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 ) -> list[RequestOutput]:
        """One result per prompt, in order. `prompts`: a string, token ids, or a list of either
        (or of vLLM's {"prompt": ...} / {"prompt_token_ids": ...} dicts); `sampling_params`: one
        for all, or one per prompt (default: SamplingParams()); `lora_request`: the LoRA adapter to
        generate with, one for all or one per prompt (None: the base model), as vLLM takes it. Every
        prompt and value is checked before any work starts: ValueError names the prompt and the value."""
        return self._run(as_prompts(prompts), sampling_params, use_tqdm, lora_request)

    def chat(self, messages: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             ) -> list[RequestOutput]:
        """`generate` for conversations: one ([{"role": ..., "content": ...}, ...]) or a list of them,
        each rendered by the model's chat template with the assistant's turn to come."""
        return self._run(as_conversations(messages), sampling_params, use_tqdm, lora_request)

    def embed(self, prompts: Any, truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """Each prompt's embedding, in order (what /v1/embeddings answers): the final hidden state
        pooled (last token, or as the model's `1_Pooling/config.json` says) and L2-normalised, each
        prompt one prefill batched with the others. `prompts` as `generate` takes them;
        `truncate_prompt_tokens` keeps each prompt's last N tokens. ValueError for a bad prompt, or
        a model this engine cannot pool (the padded engine returns no hidden states)."""
        info = self.model.info()
        if info.pooling is None:
            raise ValueError(f"{info.model_id} cannot be pooled into embeddings: {info.pooling_error}")
        parameters = GenerateParameters(max_new_tokens=1, embed=True, truncate=truncate_prompt_tokens)
        requests = [self._embed_request(index, prompt, parameters) for index, prompt in enumerate(as_prompts(prompts))]
        seq_to_index = {self.engine.add(encoded): index for index, encoded in enumerate(requests)}  # all checked first
        embeddings = self._run_embeddings(seq_to_index)
        return [EmbeddingRequestOutput(encoded.key.request_id, EmbeddingOutput(embeddings[index]), encoded.input_ids)
                for index, encoded in enumerate(requests)]

    def _embed_request(self, index: int, prompt: Prompt, parameters: GenerateParameters) -> Encoded:
        try:
            key = RequestKey(CLIENT_ID, str(next(self._request_counter)))
            return self.encoder.encode_ids(key, self._input_ids(prompt, parameters), parameters)
        except ValidationError as exc:
            raise ValueError(f"prompt {index}: {exc}") from None

    def _run_embeddings(self, seq_to_index: dict[int, int]) -> dict[int, list[float]]:
        embeddings: dict[int, list[float]] = {}
        try:
            while self.engine.has_unfinished():
                for generation in self.engine.step():
                    if generation.error is not None:
                        raise ValueError(f"prompt {seq_to_index[generation.seq_id]}: {generation.error}")
                    if generation.embedding is not None:
                        embeddings[seq_to_index[generation.seq_id]] = _floats(generation.embedding)
        except BaseException:
            self.engine.reset()  # an interrupted run leaves nothing behind for the next one
            raise
        return embeddings

    # -- one run -------------------------------------------------------------------------------

    def _run(self, prompts: list[Prompt], sampling_params: Any, use_tqdm: bool,
             lora_request: Any = None) -> list[RequestOutput]:
        requests = [self._request(index, prompt, params)
                    for index, (prompt, params) in enumerate(zip(prompts, per_prompt(sampling_params, len(prompts))))]
        adapters = self._adapters(lora_request, len(prompts))
        sequences = self._start(requests, adapters)
        progress = Progress(len(requests), use_tqdm)
        try:
            while self.engine.has_unfinished():
                generations = self.engine.step()
                now = time.monotonic()  # the step's end: when its tokens came out of the engine
                for generation in generations:
                    self._advance(*sequences[generation.seq_id], generation, progress, now)
        except BaseException:
            self.detokenizer.forget([sequence.key for _, sequence in sequences.values()])
            self.engine.reset()  # an interrupted run leaves nothing behind for the next one
            raise
        finally:
            progress.close()
        return [request.to_output() for request in requests]

    def _request(self, index: int, prompt: Prompt, params: SamplingParams) -> _Request:
        """The prompt's ids and its n sequences, each checked and encoded as a tokenizer would."""
        request_id = str(next(self._request_counter))
        try:
            input_ids, images = self._prompt(prompt, params.to_parameters())
            request = _Request(request_id, self._prompt_text(prompt), input_ids, params, [])
            for sequence_index in range(params.n):
                key = RequestKey(CLIENT_ID, f"{request_id}/{sequence_index}")
                parameters = params.to_parameters(sequence_index)
                encoded = self.encoder.encode_ids(key, input_ids, parameters, images)
                request.sequences.append(GeneratedSequence(index, sequence_index, key, params, encoded, parameters))
        except ValidationError as exc:
            raise ValueError(f"prompt {index}: {_vllm_names(str(exc))}") from None
        return request

    def _prompt(self, prompt: Prompt, parameters: GenerateParameters) -> tuple[list[int], list[EncodedImage]]:
        """The prompt's ids and its images (decoded, processed and placed as the tokenizer service
        does for a server's request)."""
        if prompt.token_ids is not None:
            return self._input_ids(prompt, parameters), []
        return self.encoder.prompt(Generate("", prompt.text, prompt.messages, parameters, images=prompt.images or None))

    def _input_ids(self, prompt: Prompt, parameters: GenerateParameters) -> list[int]:
        if prompt.images or any(message.parts for message in prompt.messages or ()):
            raise ValidationError("inputs", "embeddings of prompts with images are not served")
        if prompt.token_ids is None:
            return self.encoder.input_ids(Generate("", prompt.text, prompt.messages, parameters))
        vocab_size = self.model.vocab_size
        for token_id in prompt.token_ids:
            if not 0 <= token_id < vocab_size:
                raise ValidationError("inputs", f"token id {token_id} is outside the vocabulary [0, {vocab_size})")
        return prompt.token_ids

    def _prompt_text(self, prompt: Prompt) -> str | None:
        if prompt.messages is not None:
            return self.encoder.render_chat(prompt.messages)
        return prompt.text

    def _adapters(self, lora_request: Any, num_prompts: int) -> list[AdapterRef | None]:
        """Each prompt's adapter, registered with the engine (checked against the model) the first
        time it is named; ValueError for a request that is not a LoRARequest or an adapter that
        cannot be served."""
        if lora_request is None or isinstance(lora_request, LoRARequest):
            lora_requests: list[Any] = [lora_request] * num_prompts
        elif isinstance(lora_request, Sequence) and len(lora_request) == num_prompts:
            lora_requests = list(lora_request)
        else:
            raise ValueError(f"lora_request must be a LoRARequest, None, or a list of one per prompt ({num_prompts})")
        refs: list[AdapterRef | None] = []
        for index, item in enumerate(lora_requests):
            if item is not None and not isinstance(item, LoRARequest):
                raise ValueError(f"prompt {index}: lora_request must be a LoRARequest or None, "
                                 f"got {type(item).__name__}")
            refs.append(None if item is None else self.engine.adapter(item.lora_name, item.lora_path))
        return refs

    def _start(self, requests: list[_Request],
               adapters: list[AdapterRef | None]) -> dict[int, tuple[_Request, GeneratedSequence]]:
        """Every sequence queued in the engine at once (with its prompt's adapter), its decode
        state with the detokenizer."""
        sequences = {}
        for request, adapter in zip(requests, adapters, strict=True):
            request.num_unfinished = len(request.sequences)
            request.metrics.arrival_time = time.monotonic()
            for sequence in request.sequences:
                self.detokenizer.start(sequence.encoded, sequence.parameters)
                sequences[self.engine.add(sequence.encoded, adapter)] = request, sequence
        return sequences

    def _advance(self, request: _Request, sequence: GeneratedSequence, generation: Generation,
                 progress: Progress, now: float) -> None:
        """A step's token through the detokenizer; a stop string ends the request in the engine."""
        answer = self.detokenizer.next_event(TokenStep(sequence.key, generation))
        if answer is None:
            return
        event, stopped = answer
        sequence.add(event)
        if sequence.index == 0:
            request.metrics.token_times.append(now)
        if stopped:
            self.engine.abort(generation.seq_id)
        if sequence.finished:
            request.num_unfinished -= 1
            if not request.num_unfinished:
                request.metrics.finished_time = now
                progress.prompt_done(len(request.prompt_token_ids), sum(len(s.token_ids) for s in request.sequences))


@functools.cache
def _unfreeze_at_exit() -> None:
    """Frozen objects are never finalized: extension modules would report them as leaks at exit."""
    atexit.register(gc.unfreeze)


def _checked(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} {value!r} must be one of {', '.join(allowed)}")
    return value


def _floats(embedding: bytes) -> list[float]:
    """The worker's little-endian float32 bytes as Python floats."""
    return list(struct.unpack(f"<{len(embedding) // 4}f", embedding))


def _vllm_names(message: str) -> str:
    """TGI's messages name `max_new_tokens`; offline callers set it as `max_tokens`."""
    return message.replace("`max_new_tokens`", "`max_tokens`")
