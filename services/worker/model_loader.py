"""Loads the model behind the KV-cache layout that fits it: the paged engine's where its forward covers
the architecture, else the padded engine's (`--kv-cache`, `--backend`, speculation and a draft model
checked against the layout here, before anything is built)."""

from __future__ import annotations

import logging

from ztgi.common.model_source import ModelNotFoundError, resolve_model
from ztgi.services.worker.backend import Model
from ztgi.services.worker.config import DEFAULT_QUANTIZED_MAX_ROWS, KV_CACHES
from ztgi.services.worker.heap_trimmer import trim_heap
from ztgi.services.worker.lora.site_layout import lora_targets
from ztgi.services.worker.models import families
from ztgi.services.worker.models.loading import LoadedModel, load
from ztgi.services.worker.padded.model import PaddedModel
from ztgi.services.worker.paged.model import PagedModel
from ztgi.services.worker.shards.module_sharding import shard_module
from ztgi.services.worker.shards.shard_group import ShardGroup
from ztgi.services.worker.shards.shard_plan import ShardPlan
from ztgi.services.worker.shards.shard_rank import ShardRank

logger = logging.getLogger(__name__)


def resolve_kv_cache(kv_cache: str, backend: str, config: object) -> str:
    """`auto`: paged where the paged forward covers the architecture, else padded."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"--kv-cache {kv_cache!r} must be one of {', '.join(KV_CACHES)}")
    paged_fits = families.supports(config) and backend != "transformers"
    if kv_cache == "auto":
        return "paged" if paged_fits else "padded"
    if kv_cache == "paged" and not paged_fits:
        reason = ("--backend transformers was asked for" if backend == "transformers"
                  else families.unsupported_reason(config))
        raise ValueError(f"--kv-cache paged: {reason}; use --kv-cache padded (or auto) for the transformers forward")
    return kv_cache


def load_model(model_id: str, dtype: str = "auto", device: str = "auto", backend: str = "auto",
               kv_cache: str = "auto", block_size: int = 16, quantize: str = "none", speculate: int = 0,
               float32_decode_attention: bool = False, draft_model_id: str | None = None,
               quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS,
               native_kernels: bool = True, group: ShardGroup | None = None) -> Model:
    """The model behind the layout `kv_cache` picks; ValueError/TypeError/ModelNotFoundError.
    With `group` (this rank's worker group) the paged model holds the rank's share of the weights.
    `speculate` (proposed tokens per step) needs the paged layout, and so does a draft model
    (`draft_model_id`, loaded like the model, on its device and dtype), which needs `speculate`."""
    if draft_model_id is not None and not speculate:
        raise ValueError("--draft-model-id needs --speculate N > 0: the number of tokens the draft proposes "
                         "per step (4 is a common choice)")
    if draft_model_id is not None:
        _draft_source(draft_model_id)  # a missing draft fails before the model loads
    loaded = load(model_id, dtype, device, quantize, quantized_max_rows, native_forward=backend != "transformers")
    if resolve_kv_cache(kv_cache, backend, loaded.module.config) == "paged":
        draft = (_load_draft(draft_model_id, dtype, device, quantize, quantized_max_rows)
                 if draft_model_id is not None else None)
        rank = _shard(loaded, group) if group is not None else None
        paged = PagedModel(loaded, block_size, speculate, float32_decode_attention, draft, native_kernels, rank)
        _release_load_memory(loaded, draft)
        return paged
    if loaded.vision is not None:
        raise ValueError(f"{loaded.name} is a vision-language model: images are served by the paged KV cache and "
                         "ztgi's native forward only; use --kv-cache paged (or auto) and --backend auto")
    if group is not None:
        raise ValueError(f"--num-shard {group.size} needs the paged KV cache and ztgi's native forward: this model "
                         "runs on the padded one (--kv-cache padded, --backend transformers, or an architecture "
                         f"the native forward does not serve: {', '.join(families.SUPPORTED)})")
    if draft_model_id is not None:
        raise ValueError("--draft-model-id needs the paged KV cache, and this model runs on the padded one "
                         "(--kv-cache padded, or a model the paged forward cannot serve)")
    if speculate:
        raise ValueError(f"--speculate {speculate} needs the paged KV cache, and this model runs on the padded one "
                         "(--kv-cache padded, or a model the paged forward cannot serve): use --speculate 0")
    if float32_decode_attention:
        logger.warning("--float32-decode-attention applies to the paged KV cache only; ignored")
    padded = PaddedModel(loaded, backend)
    _release_load_memory(loaded)
    return padded


def _shard(loaded: LoadedModel, group: ShardGroup) -> ShardRank:
    """The rank's share of `loaded`'s weights, cut in place; ValueError where the model does not split."""
    plan = ShardPlan.for_rank(loaded.config, group.rank, group.size)
    targets = lora_targets(loaded.module)  # the whole model's shapes, before the cut
    shard_module(loaded.module, plan)
    logger.info("rank %d of %d: %d of %d query heads, %d KV head(s) from %d, vocabulary rows %d-%d", group.rank,
                group.size, plan.num_heads, plan.sizes.num_heads, plan.num_kv_heads, plan.first_kv_head,
                plan.vocab.start, plan.vocab.stop)
    return ShardRank(group, plan, targets)


def _release_load_memory(*models: LoadedModel | None) -> None:
    """What building the layers left resident: the GGUF's mapped pages (the layers hold packed
    copies) and the heap's free pages (the codes unpacked as bytes on the way)."""
    for loaded in models:
        if loaded is not None and loaded.checkpoint is not None:
            loaded.checkpoint.release_pages()
    trim_heap()


def _draft_source(draft_model_id: str) -> None:
    try:
        resolve_model(draft_model_id)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"--draft-model-id {draft_model_id!r}: {exc}") from None


def _load_draft(draft_model_id: str, dtype: str, device: str, quantize: str,
                quantized_max_rows: int | None) -> LoadedModel:
    try:
        return load(draft_model_id, dtype, device, quantize, quantized_max_rows)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"--draft-model-id {draft_model_id!r}: {exc}") from None


def load_padded_model(model_id: str, dtype: str = "auto", device: str = "auto", backend: str = "auto",
                      quantize: str = "none",
                      quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS) -> PaddedModel:
    """`load_model` with `kv_cache="padded"`, typed as what it is (benchmarks use the layout's own calls)."""
    model = load_model(model_id, dtype, device, backend, "padded", quantize=quantize,
                       quantized_max_rows=quantized_max_rows)
    assert isinstance(model, PaddedModel)
    return model


def load_paged_model(model_id: str, dtype: str = "auto", device: str = "auto", block_size: int = 16,
                     quantize: str = "none", speculate: int = 0, draft_model_id: str | None = None) -> PagedModel:
    """`load_model` with `kv_cache="paged"`, typed as what it is (benchmarks use the layout's own calls)."""
    model = load_model(model_id, dtype, device, kv_cache="paged", block_size=block_size, quantize=quantize,
                       speculate=speculate, draft_model_id=draft_model_id)
    assert isinstance(model, PagedModel)
    return model
