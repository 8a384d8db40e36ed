"""The model: weights on a device and one step of generation over a batch (TGI's CausalLM)."""

from __future__ import annotations

import logging
import time

import torch
from transformers import AutoModelForCausalLM

from common.messages import Generation, Timings, WorkerInfo
from common.model_source import DEFAULT_MODEL_ID, resolve_model
from services.worker import kv_cache, llama_forward
from services.worker.batch import CausalLMBatch
from services.worker.config import BACKENDS
from services.worker.kv_cache import KVCache
from services.worker.llama_forward import LlamaForward
from services.worker.transformers_forward import TransformersForward
from services.worker.top_tokens import top_tokens

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """`auto`: cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: float32 on CPU; bfloat16 on CUDA where supported, else float16."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def resolve_backend(backend: str, config: object) -> str:
    """`auto`: ztgi's own forward where it has one for the architecture, else `transformers`."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r} must be one of {', '.join(BACKENDS)}")
    native = llama_forward.supports(config)
    if backend == "auto":
        return "native" if native else "transformers"
    if backend == "native" and not native:
        raise ValueError(f"--backend native has no forward for model type {getattr(config, 'model_type', None)!r}"
                         " (it has plain Llama); use --backend transformers")
    return backend


class Model:
    """Any `AutoModelForCausalLM` on a device, and TGI's `generate_token` over padded batches.

    The forward is ztgi's own for the architectures it has (`LlamaForward`), else the
    `transformers` module's (`TransformersForward`); `backend` picks ("auto": the first that fits).
    """

    def __init__(self, model_id: str = DEFAULT_MODEL_ID, dtype: str = "auto", device: str = "auto",
                 backend: str = "auto") -> None:
        source = resolve_model(model_id)
        self.name = source.name
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        started = time.monotonic()
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=self.dtype, device_map=str(self.device))
        model.eval()
        config = self.config = model.config.get_text_config(decoder=True)
        kv_cache.check_supported(model.config)
        self.vocab_size = int(config.vocab_size)
        self.num_layers = int(config.num_hidden_layers)
        self.max_position_embeddings = int(getattr(config, "max_position_embeddings", None) or 2**31 - 1)
        self.eos_token_ids = frozenset(_eos_token_ids(model))
        self.backend = resolve_backend(backend, model.config)
        with torch.inference_mode():
            self.forward_pass = LlamaForward(model) if self.backend == "native" else TransformersForward(model)
        logger.info("loaded %s on %s (%s, %s forward) in %.1f s; eos %s", self.name, self.device,
                    str(self.dtype)[6:], self.backend, time.monotonic() - started, sorted(self.eos_token_ids))

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            model_id=self.name, dtype=str(self.dtype).removeprefix("torch."), device=self.device.type,
            eos_token_ids=sorted(self.eos_token_ids), vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token of one sequence: 2 x layers x kv_heads x head_dim x dtype."""
        config = self.config
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * config.num_hidden_layers * num_kv_heads * head_dim * element_size

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
        is_prefill = batch.past is None
        wants_prefill_logprobs = is_prefill and any(r.prefill_logprobs for r in batch.requests)
        logits, past = self.forward(batch, all_positions=wants_prefill_logprobs)
        forward_done = self._synchronize()
        next_ids, logprobs = batch.chooser(logits[:, -1, :], *self._history(batch))
        rows = self._step_rows(batch, next_ids, logprobs)
        prefill_logprobs = self._prefill_logprobs(batch, logits) if wants_prefill_logprobs else {}
        generations = self._generations(batch, rows, prefill_logprobs)
        next_batch = None if batch.all_stopped else batch
        if next_batch is not None:
            next_batch.advance(next_ids, past)
        done = time.perf_counter_ns()
        return generations, next_batch, Timings(
            forward_ns=forward_done - started, decode_ns=done - forward_done, total_ns=done - started)

    def forward(self, batch: CausalLMBatch, all_positions: bool = False) -> tuple[torch.Tensor, KVCache]:
        """Logits `[batch, positions, vocab]` (last position only unless `all_positions`) and the new KV."""
        cache = batch.past or KVCache.allocate(self.num_layers, batch.attention_mask.shape[1])
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
    def _step_rows(batch: CausalLMBatch, next_ids: torch.Tensor, logprobs: torch.Tensor) -> list[list[float]]:
        """One host transfer per step: per row [token id, logprob, num top, top ids..., top logprobs...]."""
        chosen = logprobs.gather(1, next_ids.unsqueeze(1))
        columns = [next_ids.unsqueeze(1).double(), chosen.double()]
        if any(batch.top_n_tokens):
            top_ids, top_logprobs, counts = top_tokens(logprobs, batch.top_n_tokens)
            columns += [counts.unsqueeze(1).double(), top_ids.double(), top_logprobs.double()]
        return torch.cat(columns, dim=1).tolist()

    @staticmethod
    def _prefill_logprobs(batch: CausalLMBatch, logits: torch.Tensor) -> dict[int, list[float]]:
        """Row -> logprob of each prompt token given the ones before it (first: NaN), raw logits."""
        width = batch.input_ids.shape[1]
        wanted = [i for i, r in enumerate(batch.requests) if r.prefill_logprobs]
        parts = []
        for i in wanted:
            start = width - batch.input_lengths[i]
            row_logprobs = torch.log_softmax(logits[i, start:width - 1].float(), dim=-1)
            parts.append(row_logprobs.gather(1, batch.input_ids[i, start + 1:, None]).squeeze(1))
        flat = torch.cat(parts).tolist()
        result, offset = {}, 0
        for i in wanted:
            count = batch.input_lengths[i] - 1
            result[i] = [float("nan")] + flat[offset:offset + count]
            offset += count
        return result

    @staticmethod
    def _generations(batch: CausalLMBatch, rows: list[list[float]],
                     prefill_logprobs: dict[int, list[float]]) -> list[Generation]:
        """Checks stopping for every running request and builds its Generation; stopped ones are skipped."""
        generations = []
        for i, (request, stopping, row) in enumerate(zip(batch.requests, batch.stopping_criterias, rows)):
            if stopping.stopped:
                continue  # finished at an earlier step, waiting for the scheduler's Filter
            token_id = int(row[0])
            finish_reason = stopping(token_id)
            top_ids, top_logprobs = _top_of_row(row)
            generations.append(Generation(
                request_id=request.request_id, token_id=token_id, logprob=row[1],
                finish_reason=finish_reason, generated_tokens=stopping.num_generated,
                seed=request.sampling.seed if request.sampling.do_sample else None,
                top_ids=top_ids, top_logprobs=top_logprobs,
                prefill_ids=list(request.input_ids) if i in prefill_logprobs else None,
                prefill_logprobs=prefill_logprobs.get(i)))
        return generations


def _top_of_row(row: list[float]) -> tuple[list[int], list[float]]:
    if len(row) == 2:
        return [], []
    count, k = int(row[2]), (len(row) - 3) // 2
    return [int(t) for t in row[3:3 + count]], row[3 + k:3 + k + count]


def _eos_token_ids(model: torch.nn.Module) -> list[int]:
    """EOS ids from the generation config and the model config (each may be an int or a list)."""
    ids: list[int] = []
    for config in (getattr(model, "generation_config", None), model.config):
        value = getattr(config, "eos_token_id", None) if config is not None else None
        if value is not None:
            ids.extend([value] if isinstance(value, int) else value)
    return sorted(set(ids))
