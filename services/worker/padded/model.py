"""The model: weights on a device and one step of generation over a batch (TGI's CausalLM)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import ClassVar

import torch

from ztgi.common.messages import Generation, Timings, Warmup, WarmupResult, WorkerInfo
from ztgi.services.worker.layers.quantization import factory
from ztgi.services.worker.models import llama_weights
from ztgi.services.worker.models.loading import LoadedModel
from ztgi.services.worker.padded import kv_cache
from ztgi.services.worker.padded.batch import CausalLMBatch
from ztgi.services.worker.padded.kv_cache import KVCache
from ztgi.services.worker.padded.llama_forward import LlamaForward
from ztgi.services.worker.padded.options import BACKENDS
from ztgi.services.worker.padded.transformers_forward import TransformersForward
from ztgi.services.worker.padded.warmup import run_warmup
from ztgi.services.worker.sampling.generations import failed, step_rows, top_of_row
from ztgi.services.worker.sampling.top_tokens import row_top_tokens

logger = logging.getLogger(__name__)

NO_HIDDEN_STATES = ("embeddings need the paged engine: the padded engine (--kv-cache padded, --backend transformers, "
                    "or an architecture without a native paged forward) does not return hidden states")


@dataclasses.dataclass(frozen=True)
class PromptLogprobs:
    """One request's prompt logprobs (first NaN) and, when asked for, each position's top ids and logprobs."""

    logprobs: list[float]
    top: tuple[list[list[int]], list[list[float]]] | None

def resolve_backend(backend: str, config: object) -> str:
    """`auto`: ztgi's own forward where it has one for the architecture, else `transformers`."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r} must be one of {', '.join(BACKENDS)}")
    native = llama_weights.supports(config)
    if backend == "auto":
        return "native" if native else "transformers"
    if backend == "native" and not native:
        raise ValueError(f"--backend native has no forward for model type {getattr(config, 'model_type', None)!r}"
                         " (it has plain Llama); use --backend transformers")
    return backend


class PaddedModel:
    """Any `AutoModelForCausalLM` on a device, and TGI's `generate_token` over padded batches.

    The forward is ztgi's own for the architectures it has (`LlamaForward`), else the
    `transformers` module's (`TransformersForward`); `backend` picks ("auto": the first that fits).
    """

    kv_cache: ClassVar[str] = "padded"
    batch_type: ClassVar[type[CausalLMBatch]] = CausalLMBatch

    def __init__(self, loaded: LoadedModel, backend: str = "auto") -> None:
        self.loaded = loaded
        self.name = loaded.name
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.config = loaded.config
        kv_cache.check_supported(loaded.module.config)
        self.vocab_size = loaded.vocab_size
        self.num_layers = loaded.num_layers
        self.max_position_embeddings = loaded.max_position_embeddings
        self.eos_token_ids = loaded.eos_token_ids
        self.backend = resolve_backend(backend, loaded.module.config)
        with torch.inference_mode():
            module = loaded.module
            linear = factory.factory(loaded.quantize, module, loaded.gguf_file, self.backend, self.device,
                                              self.dtype, loaded.quantized_max_rows, stored=loaded.checkpoint,
                                              float32_levels=loaded.float32_levels)
            self.forward_pass = (LlamaForward(module, linear) if self.backend == "native"
                                 else TransformersForward(module))
        logger.info("padded KV cache, %s forward, %s weights", self.backend, linear.describe())

    def info(self) -> WorkerInfo:
        return dataclasses.replace(self.loaded.info(), pooling_error=NO_HIDDEN_STATES)

    def warmup(self, command: Warmup, memory_budget_mb: int, cpu_prefill_tokens: int | None,
               step_target_ms: int) -> WarmupResult:
        return WarmupResult(command.command_id, run_warmup(self, command, memory_budget_mb, cpu_prefill_tokens))

    @property
    def kv_bytes_per_token(self) -> int:
        return self.loaded.kv_bytes_per_token

    # -- one step ------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate_token(self, batch: CausalLMBatch) -> tuple[list[Generation], CausalLMBatch | None, Timings]:
        """Prefill (first call) or decode one token for every request of `batch`.

        Returns the generations of the requests still running, the batch for the next step
        (still holding requests that just finished, for the scheduler to Filter), or None when
        every request has stopped, and where the time went.
        """
        started = time.perf_counter_ns()
        if batch.all_stopped:
            return [], None, Timings()
        is_prefill = batch.kv_cache is None
        wants_prefill_logprobs = is_prefill and any(r.prefill_logprobs for r in batch.requests)
        logits, step_cache = self.forward(batch, all_positions=wants_prefill_logprobs)
        forward_done = self._synchronize()
        next_ids, logprobs = batch.chooser(logits[:, -1, :], *self._history(batch))
        rows = step_rows(next_ids, logprobs, batch.top_n_tokens)
        prefill_logprobs = self._prefill_logprobs(batch, logits) if wants_prefill_logprobs else {}
        generations = self._generations(batch, rows, prefill_logprobs)
        next_batch = None if batch.all_stopped else batch
        if next_batch is not None:
            next_batch.advance(next_ids, step_cache)
        done = time.perf_counter_ns()
        return generations, next_batch, Timings(
            forward_ns=forward_done - started, decode_ns=done - forward_done, total_ns=done - started)

    def forward(self, batch: CausalLMBatch, all_positions: bool = False) -> tuple[torch.Tensor, KVCache]:
        """Logits `[batch, positions, vocab]` (last position only unless `all_positions`) and the new KV."""
        cache = batch.kv_cache or KVCache.allocate(self.num_layers, batch.attention_mask.shape[1])
        logits = self.forward_pass(batch.input_ids, batch.position_ids, batch.forward_attention_mask, cache,
                                   num_logits=0 if all_positions else 1)
        cache.commit(batch.input_ids.shape[1])
        return logits, cache

    def _synchronize(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter_ns()

    @staticmethod
    def _history(batch: CausalLMBatch) -> tuple[torch.Tensor, torch.Tensor] | tuple[()]:
        return batch.token_history() if batch.chooser.needs_history else ()

    @staticmethod
    def _prefill_logprobs(batch: CausalLMBatch, logits: torch.Tensor) -> dict[int, PromptLogprobs]:
        """Row -> logprob of each prompt token given the ones before it (first: NaN), raw logits,
        and with the request's `top_n_tokens` each position's likeliest tokens (first: none)."""
        width = batch.input_ids.shape[1]
        result = {}
        for i, request in enumerate(batch.requests):
            if not request.prefill_logprobs:
                continue
            start = width - batch.input_lengths[i]
            row_logprobs = torch.log_softmax(logits[i, start:width - 1].float(), dim=-1)
            chosen = row_logprobs.gather(1, batch.input_ids[i, start + 1:, None]).squeeze(1)
            top = row_top_tokens(row_logprobs, request.top_n_tokens) if request.top_n_tokens else None
            result[i] = PromptLogprobs([float("nan")] + chosen.tolist(),
                                       None if top is None else ([[], *top[0]], [[], *top[1]]))
        return result

    @staticmethod
    def _generations(batch: CausalLMBatch, rows: list[list[float]],
                     prefill_logprobs: dict[int, PromptLogprobs]) -> list[Generation]:
        """Checks stopping for every running request and builds its Generation; stopped ones are skipped."""
        generations = []
        for i, (request, stopping, row) in enumerate(zip(batch.requests, batch.stopping_criteria, rows)):
            if stopping.stopped:
                continue  # finished at an earlier step, waiting for the scheduler's Filter
            token_id = int(row[0])
            finish_reason = stopping(token_id)
            top_ids, top_logprobs = top_of_row(row)
            prompt = prefill_logprobs.get(i)
            generation = Generation(
                seq_id=request.seq_id, token_id=token_id, logprob=row[1],
                finish_reason=finish_reason, generated_tokens=stopping.num_generated,
                seed=request.sampling.seed if request.sampling.do_sample else None,
                top_ids=top_ids, top_logprobs=top_logprobs,
                prefill_ids=list(request.input_ids) if prompt is not None else None,
                prefill_logprobs=prompt.logprobs if prompt is not None else None,
                prefill_top_ids=prompt.top[0] if prompt is not None and prompt.top is not None else None,
                prefill_top_logprobs=prompt.top[1] if prompt is not None and prompt.top is not None else None)
            error = NO_HIDDEN_STATES if request.embed else batch.chooser.grammar_failure(i)
            generations.append(failed(generation, stopping, error))
        return generations
