"""The paged model: weights, the KV pool, and one step of generation over a paged batch."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import ClassVar

import torch

from ztgi.common.messages import Generation, Timings, Warmup, WarmupResult, WorkerInfo
from ztgi.services.worker.kernels.native_attention import NativeAttention
from ztgi.services.worker.layers.kv_pool import KVPool, KVShape
from ztgi.services.worker.layers.layer_ops import NativeLayerOps
from ztgi.services.worker.layers.quantization import factory
from ztgi.services.worker.lora.lora_adapters import LoraAdapters
from ztgi.services.worker.lora.site_layout import lora_targets
from ztgi.services.worker.models import families
from ztgi.services.worker.models.decoder import PagedDecoderForward
from ztgi.services.worker.models.families import layer_windows, paged_forward
from ztgi.services.worker.models.llama import PagedLlamaForward
from ztgi.services.worker.models.llama_decode_stack import NativeDecodeStack, block_products_only
from ztgi.services.worker.models.loading import LoadedModel
from ztgi.services.worker.paged.batch import PagedBatch, Sequence
from ztgi.services.worker.paged.draft_proposer import DraftProposer
from ztgi.services.worker.paged.image_embeddings import ImageEmbeddings
from ztgi.services.worker.paged.lora_attach import attach
from ztgi.services.worker.paged.pooler import Pooler
from ztgi.services.worker.paged.speculator import Speculator
from ztgi.services.worker.paged.step_inputs import StepInputs, build_step_inputs
from ztgi.services.worker.paged.warmup import warm_up
from ztgi.services.worker.sampling.generations import failed, step_rows, top_of_row
from ztgi.services.worker.sampling.top_tokens import row_top_tokens
from ztgi.services.worker.shards.lora_shards import shard_adapter
from ztgi.services.worker.shards.parallel_layers import parallelize
from ztgi.services.worker.shards.shard_rank import ShardRank
from ztgi.services.worker.shards.stored_shards import ShardedStoredWeights

logger = logging.getLogger(__name__)


class PagedModel:
    """A model of a natively served family (`models/families.py`) served from a block pool; `warmup`
    sizes and allocates the pool."""

    kv_cache: ClassVar[str] = "paged"
    batch_type: ClassVar[type[PagedBatch]] = PagedBatch

    def __init__(self, loaded: LoadedModel, block_size: int = 16, speculate: int = 0,
                 float32_decode_attention: bool = False, draft: LoadedModel | None = None,
                 native_kernels: bool = True, shard: ShardRank | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {block_size}")
        self.loaded = loaded
        self.name = loaded.name
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.vocab_size = loaded.vocab_size
        self.max_position_embeddings = loaded.max_position_embeddings
        self.eos_token_ids = loaded.eos_token_ids
        self.block_size = block_size
        self.kv_shape = KVShape(loaded.num_layers, block_size, loaded.num_kv_heads, loaded.head_dim, loaded.dtype)
        self.shard = shard  # this process's rank of a tensor-parallel group, if the model is sharded
        with torch.inference_mode():
            # a shard's weights are slices: never matched to the file's blocks by name (int8/int4), and the
            # file's blocks as stored are sliced as the weights are
            gguf_file = loaded.gguf_file if shard is None else None
            stored = (ShardedStoredWeights(loaded.checkpoint, shard.plan)
                      if shard is not None and loaded.checkpoint is not None else loaded.checkpoint)
            linear = factory.factory(loaded.quantize, loaded.module, gguf_file, "native",
                                              self.device, self.dtype, loaded.quantized_max_rows, native_kernels,
                                              stored, loaded.float32_levels)
            self.forward_pass = paged_forward(loaded.module, linear)
        self.forward_pass.attention.float32_decode = float32_decode_attention
        if native_kernels and self.device.type == "cpu" and self.dtype == torch.bfloat16:
            _use_c_kernels(self.forward_pass)
        elif native_kernels and self.device.type == "cpu" and self.dtype == torch.float32:
            _use_float32_c_kernels(self.forward_pass)
        if shard is not None:
            parallelize(self.forward_pass, shard.group, shard.plan)
        logger.info("paged KV cache, %s weights, attention %s", linear.describe(), self._attention())
        self.lora = LoraAdapters(lora_targets(loaded.module) if shard is None else shard.lora_targets,
                                 loaded.num_layers, self.dtype, self.device,
                                 attach=lambda adapters: attach(self.forward_pass, adapters),
                                 share=functools.partial(shard_adapter, plan=shard.plan) if shard else None,
                                 local_targets=lora_targets(loaded.module) if shard is not None else None)
        self.pool: KVPool | None = None
        self.max_step_tokens = 0
        self.draft_model = self._draft_proposer(draft, speculate) if draft is not None else None
        self.speculator = Speculator(speculate, block_size, self.draft_model) if speculate else None
        self.pooler = Pooler(loaded.pooling.mode, loaded.pooling.error)
        self.images = ImageEmbeddings(loaded.vision)

    def _attention(self) -> str:
        attention = self.forward_pass.attention
        where = "over gathered blocks (torch)"
        if attention.native is not None:
            where = "in place (C kernels)" if attention.native.reads_prefill else \
                "decode rows in place (C kernels), prefill chunks over gathered blocks (torch)"
        steps = ", layer steps in C" if isinstance(getattr(self.forward_pass, "ops", None), NativeLayerOps) else ""
        steps += ", decode steps' layers in one C call" if getattr(self.forward_pass, "stack", None) else ""
        return where + (", decode rows in float32" if attention.float32_decode else "") + steps

    def _draft_proposer(self, draft: LoadedModel, speculate: int) -> DraftProposer:
        """The draft model's proposer; ValueError where it cannot propose for this model."""
        if not speculate:
            raise ValueError("--draft-model-id needs --speculate N > 0: the number of tokens the draft proposes "
                             "per step (4 is a common choice)")
        if draft.vocab_size != self.vocab_size:
            raise ValueError(f"the draft model {draft.name} has a vocabulary of {draft.vocab_size} tokens and "
                             f"{self.name} one of {self.vocab_size}: a draft must share the target's tokenizer")
        if not families.supports(draft.module.config):
            raise ValueError(f"the draft model {draft.name}: {families.unsupported_reason(draft.module.config)}")
        with torch.inference_mode():
            linear = factory.factory(draft.quantize, draft.module, draft.gguf_file, "native",
                                              draft.device, draft.dtype, draft.quantized_max_rows,
                                              stored=draft.checkpoint, float32_levels=draft.float32_levels)
        logger.info("draft model %s (%d layers) proposes up to %d tokens a step", draft.name, draft.num_layers,
                    speculate)
        proposer = DraftProposer(draft, self.block_size, linear)
        proposer.forward_pass.attention.float32_decode = self.forward_pass.attention.float32_decode
        proposer.forward_pass.attention.native = self.forward_pass.attention.native
        if isinstance(proposer.forward_pass, PagedLlamaForward) and isinstance(self.forward_pass, PagedLlamaForward):
            proposer.forward_pass.ops = self.forward_pass.ops
        return proposer

    def info(self) -> WorkerInfo:
        pooling = self.loaded.pooling
        info = dataclasses.replace(self.loaded.info(), pooling=pooling.mode, pooling_error=pooling.error,
                                   matryoshka=pooling.matryoshka, lora_targets=self.lora.targets,
                                   num_layers=self.loaded.num_layers)
        if self.draft_model is None:
            return info
        return dataclasses.replace(info, draft_model_id=self.draft_model.loaded.name)

    @property
    def kv_window(self) -> int | None:
        """The sliding window when every layer has one (the scheduler then frees the blocks behind
        it); None when any layer attends to the whole context."""
        windows = [window for window in layer_windows(self.loaded.module.config) if window is not None]
        return max(windows) if len(windows) == self.loaded.num_layers else None

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks if self.pool is not None else 0

    @property
    def bytes_per_block(self) -> int:
        """Memory of one block: the target's keys and values, and the draft model's."""
        draft = self.draft_model.kv_shape.bytes_per_block if self.draft_model is not None else 0
        return self.kv_shape.bytes_per_block + draft

    def allocate_pool(self, num_blocks: int) -> None:
        """The target's pool and the draft model's, the same number of blocks each (one block table
        addresses both)."""
        self.pool = None  # the old pool's memory goes first
        self.pool = KVPool(self.kv_shape, num_blocks, self.device)
        if self.draft_model is not None:
            self.draft_model.allocate_pool(num_blocks)

    def release_pools(self) -> None:
        """Frees the target's pool and the draft model's, before free memory is measured."""
        self.pool = None
        if self.draft_model is not None:
            self.draft_model.pool = None

    def warmup(self, command: Warmup, memory_budget_mb: int, cpu_prefill_tokens: int | None,
               step_target_ms: int) -> WarmupResult:
        return warm_up(self, command, memory_budget_mb, cpu_prefill_tokens, step_target_ms)

    # -- one step ------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate_token(self, batch: PagedBatch) -> tuple[list[Generation], PagedBatch | None, Timings]:
        """One forward over every running sequence's next tokens; a token for each sequence whose
        input is then all computed. Returns the generations, the batch for the next step (None
        once every request has stopped) and where the time went."""
        started = time.perf_counter_ns()
        if batch.all_stopped:
            return [], None, Timings()
        if self.pool is None:
            raise RuntimeError("the KV pool is not allocated: the worker was not warmed up")
        if self.speculator is not None:
            self.speculator.propose(batch)
        return self.step(batch, started)

    @torch.inference_mode()
    def step(self, batch: PagedBatch, started: int) -> tuple[list[Generation], PagedBatch | None, Timings]:
        """`generate_token` once the drafts are set (none without speculation); `started` (ns) is
        when the step began."""
        assert self.pool is not None
        with_images = any(sequence.images is not None for sequence in batch.sequences)
        failures = self.images.prepare(batch) if with_images else []
        inputs = build_step_inputs(batch, self.pool, self.pooler)
        if inputs is None:
            return failures, None if batch.all_stopped else batch, Timings()
        self.lora.begin_step([(batch.sequences[e.index].request.adapter, e.count) for e in inputs.entries])
        try:
            logits = self._forward(batch, inputs)
        finally:
            self.lora.end_step()
        forward_done = self._synchronize()
        generations = failures + self._advance(batch, inputs, logits)
        if with_images:
            self.images.release(batch)
        next_batch = None if batch.all_stopped else batch
        done = time.perf_counter_ns()
        if logger.isEnabledFor(logging.DEBUG):
            _log_step(inputs, forward_done - started, done - started)
        counts = self.speculator.counts if self.speculator is not None else None
        return generations, next_batch, Timings(
            forward_ns=forward_done - started, decode_ns=done - forward_done, total_ns=done - started,
            num_proposed=counts.num_proposed if counts else 0, num_accepted=counts.num_accepted if counts else 0)

    def _forward(self, batch: PagedBatch, inputs: StepInputs) -> torch.Tensor:
        """The step's logits; the hidden states embedding requests pool go to their sequences."""
        assert self.pool is not None
        replaced = self.images.rows(batch.sequences, inputs.entries, self.device) if self.images.encoder else None
        if inputs.hidden_rows is None:
            return self.forward_pass(inputs.input_ids, inputs.positions, inputs.attention, self.pool,
                                     inputs.logit_rows, replaced)
        logits, hidden = self.forward_pass.logits_and_hidden(inputs.input_ids, inputs.positions, inputs.attention,
                                                             self.pool, inputs.logit_rows, inputs.hidden_rows,
                                                             replaced)
        assert hidden is not None, "rows asked, rows given"
        for index, first, count in inputs.pooled:
            self.pooler.add(batch.sequences[index], hidden[first:first + count])
        return logits

    def _advance(self, batch: PagedBatch, inputs: StepInputs, logits: torch.Tensor) -> list[Generation]:
        """Chooses the sampled sequences' tokens and moves every planned sequence on."""
        rows: list[list[list[float]]] = []
        if inputs.sampled:
            rows = self._choose(batch, inputs, logits)
        self._gather_prefill_logprobs(batch, inputs, logits)
        for entry in inputs.entries:
            sequence = batch.sequences[entry.index]
            sequence.num_computed = entry.start + entry.count
            if sequence.is_prefilling:
                sequence.chunk_len = 0  # the scheduler gives the next chunk
            elif sequence.request.embed and entry.start < sequence.prompt_len:
                sequence.embedding = self.pooler.finish(sequence)
        # in the batch's order, whatever order the step ran its rows in
        return [generation for index, sequence_rows in sorted(zip(inputs.sampled, rows))
                for generation in self._generations(batch, index, sequence_rows)]

    def _choose(self, batch: PagedBatch, inputs: StepInputs, logits: torch.Tensor) -> list[list[list[float]]]:
        """Each sampled sequence's chosen token rows (one per position it verified)."""
        sampled = inputs.sampled
        if self.speculator is not None and any(batch.sequences[i].draft for i in sampled):
            return self.speculator.choose(batch, sampled, inputs.sample_logits, logits)
        chooser = batch.chooser if sampled == list(range(len(batch))) else batch.chooser.select(sampled)
        history = batch.token_history(sampled) if chooser.needs_history else ()
        scores = logits if inputs.sample_logits == list(range(logits.shape[0])) else logits.index_select(
            0, torch.tensor(inputs.sample_logits, device=logits.device))  # a copy only when rows differ
        next_ids, logprobs = chooser(scores, *history)
        return [[row] for row in step_rows(next_ids, logprobs, [batch.sequences[i].request.top_n_tokens
                                                                for i in sampled])]

    def _generations(self, batch: PagedBatch, index: int, rows: list[list[float]]) -> list[Generation]:
        """The sequence's tokens of this step: one, or with a draft the accepted run (cut at a
        token that stops the request)."""
        sequence = batch.sequences[index]
        if not sequence.draft:
            generation = self._generation(sequence, rows[0])
            return [failed(generation, sequence.stopping, self._failure(batch, index, generation))]
        num_emitted = Speculator.accepted(sequence.draft, [int(row[0]) for row in rows])
        generations = []
        for row in rows[:num_emitted]:
            generations.append(self._generation(sequence, row))
            if generations[-1].finish_reason is not None:
                break
        assert self.speculator is not None, "only drafted sequences get here"
        self.speculator.settle(batch, index, len(generations))
        return generations

    def _failure(self, batch: PagedBatch, index: int, generation: Generation) -> str | None:
        """Why the request ends in an error here: its grammar failed, or it asked for an embedding
        this model cannot pool."""
        if batch.sequences[index].request.embed and generation.embedding is None:
            return self.pooler.error
        return batch.chooser.grammar_failure(index)

    @staticmethod
    def _gather_prefill_logprobs(batch: PagedBatch, inputs: StepInputs, logits: torch.Tensor) -> None:
        """Each prompt token's logprob given the ones before it, chunk by chunk (raw logits)."""
        for entry in inputs.entries:
            first = inputs.logprob_logits.get(entry.index)
            sequence = batch.sequences[entry.index]
            if first is None or sequence.prefill_logprobs is None:  # asked for: both or neither
                continue
            targets = sequence.tokens[entry.start + 1:min(entry.start + entry.count + 1, sequence.prompt_len)]
            chunk = torch.log_softmax(logits[first:first + len(targets)].float(), dim=-1)
            ids = torch.tensor(targets, device=logits.device)[:, None]
            sequence.prefill_logprobs.extend(chunk.gather(1, ids).squeeze(1).tolist())
            if sequence.prefill_top is not None:
                top_ids, top_logprobs = row_top_tokens(chunk, sequence.request.top_n_tokens)
                sequence.prefill_top[0].extend(top_ids)
                sequence.prefill_top[1].extend(top_logprobs)

    @staticmethod
    def _generation(sequence: Sequence, row: list[float]) -> Generation:
        token_id = int(row[0])
        sequence.tokens.append(token_id)
        finish_reason = sequence.stopping(token_id)
        top_ids, top_logprobs = top_of_row(row)
        request = sequence.request
        prefill_logprobs = sequence.prefill_logprobs if sequence.stopping.num_generated == 1 else None
        prefill_top = sequence.prefill_top if prefill_logprobs is not None else None
        return Generation(
            seq_id=request.seq_id, token_id=token_id, logprob=row[1], finish_reason=finish_reason,
            generated_tokens=sequence.stopping.num_generated,
            seed=request.sampling.seed if request.sampling.do_sample else None,
            top_ids=top_ids, top_logprobs=top_logprobs,
            prefill_ids=list(sequence.tokens[:sequence.prompt_len]) if prefill_logprobs is not None else None,
            prefill_logprobs=list(prefill_logprobs) if prefill_logprobs is not None else None,
            prefill_top_ids=prefill_top[0] if prefill_top is not None else None,
            prefill_top_logprobs=prefill_top[1] if prefill_top is not None else None,
            embedding=sequence.embedding if sequence.stopping.num_generated == 1 else None)

    def _synchronize(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter_ns()


def _log_step(inputs: StepInputs, forward_ns: int, total_ns: int) -> None:
    """What a step carried and how long it took (DEBUG): the long steps behind an ITL tail."""
    spans = inputs.attention.prefills
    context = max((e.start + e.count for e in inputs.entries), default=0)
    logger.debug("step: %d decode rows, %d prefill tokens in %d chunks, longest context %d; forward %.1f ms, "
                 "total %.1f ms", inputs.num_tokens - sum(s.end - s.start for s in spans),
                 sum(s.end - s.start for s in spans), len(spans), context, forward_ns / 1e6, total_ns / 1e6)


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def _use_c_kernels(forward_pass: PagedLlamaForward | PagedDecoderForward) -> None:
    """ztgi's C attention kernels, and for Llama its layer steps and, where every kernel of a layer
    is C, the one-call decode stack, where they build on this CPU."""
    forward_pass.attention.native = NativeAttention.load()
    if isinstance(forward_pass, PagedLlamaForward) and forward_pass.attention.native is not None:
        layer_ops = NativeLayerOps.load()
        if layer_ops is not None:
            forward_pass.ops = layer_ops
            forward_pass.stack = NativeDecodeStack.load(forward_pass)


def _use_float32_c_kernels(forward_pass: PagedLlamaForward | PagedDecoderForward) -> None:
    """For a float32 Llama whose products are all GGUF block products: the float32 C layer steps,
    decode attention and one-call decode stack (AVX2). Not for float weights: those kernels sum in
    another order than torch, and `--quantize none --dtype float32` promises transformers' tokens."""
    if not isinstance(forward_pass, PagedLlamaForward) or not block_products_only(forward_pass, torch.float32):
        return
    attention = NativeAttention.load(torch.float32)
    layer_ops = NativeLayerOps.load(torch.float32) if attention is not None else None
    if attention is None or layer_ops is None:
        return
    forward_pass.attention.native = attention
    forward_pass.ops = layer_ops
    forward_pass.stack = NativeDecodeStack.load(forward_pass)
