"""The native forwards' layer factory for a resolved `--quantize`: the GGUF's blocks as stored
(`stored_linear`), int8/int4 (`quantized_linear`), or packed float weights."""

from __future__ import annotations

from typing import TypeAlias

import torch

from ztgi.services.worker.layers.quantization.options import DEFAULT_QUANTIZED_MAX_ROWS
from ztgi.services.worker.layers.quantization.quantized_linear import LinearFactory, check_supported
from ztgi.services.worker.layers.quantization.stored_linear import StoredLinearFactory, StoredWeights
from ztgi.services.worker.layers.transformers_module import TransformersModule

LayerFactory: TypeAlias = LinearFactory | StoredLinearFactory


def factory(quantize: str, model: TransformersModule, gguf_file: str | None, backend: str, device: torch.device,
            dtype: torch.dtype, max_rows: int | None = DEFAULT_QUANTIZED_MAX_ROWS,
            native: bool = True, stored: StoredWeights | None = None, float32_levels: int = 2) -> LayerFactory:
    """The native forward's layer factory for `--quantize` (resolved: not `auto`): `gguf`, the file's
    blocks as stored (`stored`, the checkpoint); int8/int4, quantized weights for calls of up to
    `max_rows` rows, a float copy above (None: quantized only); `native` False: torch's layers
    only, as `--no-native-kernels`; `float32_levels`: the block products' int8 levels for float32
    rows (`LoadedModel.float32_levels`). ValueError where it cannot run."""
    check_supported(quantize, device, dtype)
    if quantize != "none" and backend != "native":
        raise ValueError(f"--quantize {quantize} needs the native forward (--backend native), not {backend}")
    if quantize == "gguf":
        if stored is None:
            raise ValueError("--quantize gguf needs a GGUF file's tensors as stored")
        return StoredLinearFactory(stored, model, dtype, native, float32_levels)
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"--quantized-max-rows must be at least 1, or none, not {max_rows}")
    return LinearFactory(quantize, model, gguf_file, dtype, max_rows, native, float32_levels)
