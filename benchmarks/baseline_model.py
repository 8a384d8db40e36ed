"""Loading the model of a baseline as the worker loads it: same source, dtype and device rules."""

from __future__ import annotations

import logging
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ztgi.common.model_source import resolve_model

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """`auto`: cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: float32 on CPU; bfloat16 on CUDA where supported, else float16 (the worker's rule)."""
    if dtype != "auto":
        return TORCH_DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def load_tokenizer(model_id: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, left-padding with EOS when it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model_id).path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model_id: str, dtype: str, device: str) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained(resolve_model(model_id).path, dtype=...)`, in eval mode."""
    target = resolve_device(device)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(resolve_model(model_id).path, dtype=resolve_dtype(dtype, target),
                                                 device_map=str(target))
    model.eval()
    logger.info("loaded %s on %s (%s) in %.1f s", model_id, target, str(model.dtype).removeprefix("torch."),
                time.perf_counter() - started)
    return model


def eos_token_ids(model: PreTrainedModel) -> list[int]:
    """EOS ids from the generation config and the model config, as the worker reads them."""
    ids: set[int] = set()
    for config in (getattr(model, "generation_config", None), model.config):
        value = getattr(config, "eos_token_id", None) if config is not None else None
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return sorted(ids)
