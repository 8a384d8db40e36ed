"""A model id turned into weights on a device: what every backend starts from."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from ztgi.common.messages import WorkerInfo
from ztgi.common.model_source import ModelSource, resolve_model
from ztgi.services.worker.layers.quantization.options import DEFAULT_QUANTIZED_MAX_ROWS, QUANTIZE
from ztgi.services.worker.layers.transformers_module import TransformersConfig, TransformersModule
from ztgi.services.worker.models import dtype_choice, gguf_module
from ztgi.services.worker.models.gguf_checkpoint import GgufCheckpoint
from ztgi.services.worker.models.pooling import Pooling, read_pooling
from ztgi.services.worker.vision.text_view import TextView
from ztgi.services.worker.vision.vision_encoder import MODEL_TYPES as VISION_MODEL_TYPES
from ztgi.services.worker.vision.vision_encoder import QWEN2_VL_TYPES, VisionEncoder

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
    """`auto`: bfloat16 on CUDA where supported, else float16; on CPU see `dtype_choice`."""
    return DTYPES[dtype] if dtype != "auto" else dtype_choice.auto_dtype(device)


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A `transformers` causal LM on its device, and the facts about it every backend needs (of a
    vision-language model: its text part as a causal LM, and its vision side in `vision`)."""

    name: str
    device: torch.device
    dtype: torch.dtype
    module: torch.nn.Module
    config: TransformersConfig  # the text (decoder) config
    eos_token_ids: frozenset[int]
    quantize: str = "none"  # --quantize, resolved: the linear weights the native forwards build (quantized_linear)
    gguf_file: str | None = None  # the GGUF file the weights came from, if any (its 4-bit blocks, as stored)
    quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS  # --quantized-max-rows (quantized_linear)
    checkpoint: GgufCheckpoint | None = None  # `quantize` gguf: the file's tensors, as stored
    pooling: Pooling = Pooling()  # how an embedding request pools the final hidden states (models/pooling.py)
    vision: VisionEncoder | None = None  # a vision-language model's image encoder (vision/)
    # the int8 levels GGUF block products round float32 rows to: 1 where float32 is the serving dtype
    # (`--dtype auto` on a CPU without bfloat16 units), 2 where `--dtype float32` asks for it (block_linear)
    float32_levels: int = 2

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def max_position_embeddings(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", None) or 2**31 - 1)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads)

    @property
    def head_dim(self) -> int:
        config = self.config
        return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token of one sequence: 2 x layers x kv_heads x head_dim x dtype."""
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            model_id=self.name, dtype=str(self.dtype).removeprefix("torch."), device=self.device.type,
            eos_token_ids=sorted(self.eos_token_ids), vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, quantize=self.quantize,
            hidden_size=int(self.config.hidden_size), vision=self.vision is not None)


def load(model_id: str, dtype: str = "auto", device: str = "auto", quantize: str = "none",
         quantized_max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS, native_forward: bool = True) -> LoadedModel:
    """Loads the weights; ValueError for a bad device or `--quantize`, ModelNotFoundError for an
    unknown model. `native_forward` False: the model will run transformers' own forward (which
    needs every weight as a float tensor, so `auto` does not keep a GGUF's blocks)."""
    source = resolve_model(model_id)
    resolved_device = resolve_device(device)
    resolved_dtype = resolve_dtype(dtype, resolved_device)
    started = time.monotonic()
    config = AutoConfig.from_pretrained(source.path)
    if getattr(config, "model_type", None) in VISION_MODEL_TYPES:
        return _load_vision(source, config, resolved_dtype, resolved_device, quantize, started)
    quantize = gguf_module.resolve_quantize(quantize, source, config, resolved_device, native_forward)
    checkpoint = None
    if source.gguf_file is not None and gguf_module.reads_natively(config):
        checkpoint = GgufCheckpoint(source.gguf_file, config)
        module = gguf_module.build(checkpoint, config, resolved_dtype, keep_blocks=quantize == "gguf")
        if quantize != "gguf":  # every weight dequantized, on the CPU: to the device (gguf runs on CPU only)
            module.to(resolved_device)
    else:
        module = _from_pretrained(source, resolved_dtype, resolved_device)
    module.eval()
    loaded = LoadedModel(source.name, resolved_device, resolved_dtype, module,
                         module.config.get_text_config(decoder=True), frozenset(_eos_token_ids(module)),
                         quantize, source.gguf_file, quantized_max_rows, checkpoint if quantize == "gguf" else None,
                         read_pooling(source.path, config), float32_levels=_float32_levels(dtype, resolved_dtype))
    logger.info("loaded %s on %s (%s%s) in %.1f s; eos %s", loaded.name, resolved_device, str(resolved_dtype)[6:],
                ", GGUF blocks as stored" if quantize == "gguf" else "", time.monotonic() - started,
                sorted(loaded.eos_token_ids))
    return loaded


def _float32_levels(asked: str, resolved: torch.dtype) -> int:
    """One int8 level for float32 rows where float32 is only the serving dtype (`auto` on a CPU
    without bfloat16 units: llama.cpp's rounding, half the integer work of a step of many rows);
    two where `--dtype float32` asks for float32's precision."""
    return 1 if asked == "auto" and resolved == torch.float32 else 2


def _load_vision(source: ModelSource, config: TransformersConfig, dtype: torch.dtype, device: torch.device,
                 quantize: str, started: float) -> LoadedModel:
    """A vision-language model: its text part as `module`, its encoder as `vision`."""
    quantize = _vision_quantize(source, config, quantize)
    path, arguments = source.pretrained_arguments()
    multimodal = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, device_map=str(device),
                                                             **arguments).eval()
    text = TextView.of(multimodal)
    merge = config.vision_config.spatial_merge_size if config.model_type in QWEN2_VL_TYPES else None
    encoder = VisionEncoder(config.model_type, multimodal.model, int(config.image_token_id), dtype, device, merge)
    loaded = LoadedModel(source.name, device, dtype, text, text.config, frozenset(_eos_token_ids(text)),
                         quantize, pooling=read_pooling(source.path, config), vision=encoder)
    logger.info("loaded %s on %s (%s, vision-language: %s) in %.1f s; eos %s", loaded.name, device,
                str(dtype)[6:], config.model_type, time.monotonic() - started, sorted(loaded.eos_token_ids))
    return loaded


def _vision_quantize(source: ModelSource, config: TransformersConfig, quantize: str) -> str:
    """`auto` is `none`; ValueError for a GGUF or `gguf` (the encoder stays in float; int8/int4
    apply to a Llama text part, as the native forward takes them)."""
    if source.gguf_file is not None or quantize == "gguf":
        raise ValueError(f"{source.name}: a vision-language model ({config.model_type}) is served from its "
                         "safetensors, not from a GGUF file's blocks; use --quantize none, int8 or int4")
    if quantize not in QUANTIZE:
        raise ValueError(f"--quantize {quantize!r} must be one of {', '.join(QUANTIZE)}")
    return "none" if quantize == "auto" else quantize


def _from_pretrained(source: ModelSource, dtype: torch.dtype, device: torch.device) -> TransformersModule:
    path, arguments = source.pretrained_arguments()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=str(device), **arguments)


def _eos_token_ids(model: TransformersModule) -> list[int]:
    """EOS ids from the generation config and the model config (each may be an int or a list)."""
    ids: list[int] = []
    for config in (getattr(model, "generation_config", None), model.config):
        value = getattr(config, "eos_token_id", None) if config is not None else None
        if value is not None:
            ids.extend([value] if isinstance(value, int) else value)
    return sorted(set(ids))
