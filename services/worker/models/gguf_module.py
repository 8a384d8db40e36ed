"""A transformers module of a Llama GGUF built from the file in place, and what `--quantize auto` means.

transformers' GGUF loader dequantizes every tensor to float32 before casting (seconds per hundred
million weights, four bytes each at the peak). Here the module's skeleton is made on the `meta`
device (no memory) and only what the forward reads as float is filled in from `GgufCheckpoint`:
with the blocks kept (`--quantize gguf`, the default for a GGUF), the norms alone; the linear
layers and the embedding are built from the file by the layer factory (`quantized_linear`) and
`QuantizedEmbedding`. With `--quantize none` (or another mode) every weight is dequantized here,
with the values transformers' loader computes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM

from ztgi.common.model_source import ModelSource
from ztgi.services.worker.layers.quantization import block_linear
from ztgi.services.worker.layers.quantization.options import QUANTIZE
from ztgi.services.worker.layers.transformers_module import TransformersConfig, TransformersModule
from ztgi.services.worker.models import llama_weights
from ztgi.services.worker.models.gguf_checkpoint import ARCHITECTURES, GgufCheckpoint

logger = logging.getLogger(__name__)

LAYER_WEIGHTS = ("_proj.weight", "embed_tokens.weight", "lm_head.weight")  # built by the factory when kept


def reads_natively(config: TransformersConfig) -> bool:
    """Whether `GgufCheckpoint` knows this architecture's tensors (else transformers' loader reads it)."""
    return getattr(config, "model_type", None) in ARCHITECTURES


def resolve_quantize(quantize: str, source: ModelSource, config: TransformersConfig, device: torch.device,
                     native_forward: bool, native_blocks: Callable[[], bool] = block_linear.runs_natively) -> str:
    """`auto`: `gguf` (the file's blocks, as stored) where they can be served here (a GGUF Llama,
    the native forward, on CPU) and this CPU runs the C block products (`native_blocks`, asked only
    then), else `none`: torch's block products run anywhere but tens of times slower than float
    weights. `gguf` asked for where it cannot be: ValueError; where only torch's products run: as asked."""
    if quantize not in QUANTIZE:
        raise ValueError(f"--quantize {quantize!r} must be one of {', '.join(QUANTIZE)}")
    reason = _why_not_as_stored(source, config, device, native_forward)
    if quantize == "auto":
        if reason is None and not native_blocks():
            reason = ("this CPU cannot run the C block products (they need AVX512-VNNI and AVX512-BF16, or "
                      "AVX2, FMA and F16C, and a C compiler), and torch's are tens of times slower than float "
                      "weights")
        if reason and source.gguf_file is not None:
            logger.info("the GGUF's weights are dequantized: %s", reason)
        return "none" if reason else "gguf"
    if quantize == "gguf" and reason:
        raise ValueError(f"--quantize gguf serves a GGUF file's blocks as stored, and here {reason}; "
                         "use --quantize auto or none")
    return quantize


def _why_not_as_stored(source: ModelSource, config: TransformersConfig, device: torch.device,
                       native_forward: bool) -> str | None:
    if source.gguf_file is None:
        return "the model is not a GGUF file"
    if device.type != "cpu":
        return f"the block products run on CPU, and the device is {device.type}"
    if not (reads_natively(config) and llama_weights.supports(config)):
        return f"model type {getattr(config, 'model_type', None)!r} is served as stored for Llama only"
    if not native_forward:
        return "transformers' forward (--backend transformers) needs float weights"
    return None


def build(checkpoint: GgufCheckpoint, config: TransformersConfig, dtype: torch.dtype,
          keep_blocks: bool) -> TransformersModule:
    """The module with every weight from `checkpoint` in `dtype`; `keep_blocks`: the linear weights
    and the embedding left on `meta` (the factory reads them from the file)."""
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, _ in list(module.named_parameters()):
        if keep_blocks and name.endswith(LAYER_WEIGHTS):
            continue
        _set_parameter(module, name, checkpoint.float(name).to(dtype))
    if getattr(module.config, "tie_word_embeddings", False) and not keep_blocks:
        module.lm_head.weight = module.model.embed_tokens.weight
    decoder = module.model
    decoder.rotary_emb = type(decoder.rotary_emb)(config=module.config)  # its buffers, computed (not meta)
    return module


def _set_parameter(module: TransformersModule, name: str, value: torch.Tensor) -> None:
    owner, _, attribute = name.rpartition(".")
    setattr(module.get_submodule(owner), attribute, torch.nn.Parameter(value, requires_grad=False))
