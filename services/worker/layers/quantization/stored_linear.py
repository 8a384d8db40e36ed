"""The layers of a GGUF served as stored (`--quantize gguf`, what `auto` picks for a GGUF Llama).

Each linear layer multiplies the file's own blocks (`BlockCodes`, in C where the CPU has
AVX512-VNNI or AVX2, else torch's path: `block_linear`), fused layers (q/k/v, gate/up) as one product even
where the file stores their parts in different types (Q4_K_M's Q6_K v beside Q4_K q and k). A tensor
of a type no product takes is dequantized, with one log line naming it. The token embedding is read
a few rows at a time from the file (`QuantizedEmbedding`): a 128k-token vocabulary's table would
otherwise be the largest float copy in memory.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import torch

from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.quantization.block_codes import BlockCodes
from ztgi.services.worker.layers.quantization.block_linear import BlockLinear
from ztgi.services.worker.layers.quantization.torch_block_linear import torch_block_linear
from ztgi.services.worker.layers.transformers_module import TransformersModule

logger = logging.getLogger(__name__)


class StoredWeights(Protocol):
    """What the layers read of a GGUF file by transformers' parameter names (`GgufCheckpoint`)."""

    def block_codes(self, name: str) -> BlockCodes | None: ...

    def float(self, name: str) -> torch.Tensor: ...

    def type_name(self, name: str) -> str: ...

    def embedding_rows(self, token_ids: torch.Tensor) -> torch.Tensor: ...


class QuantizedEmbedding:
    """Token embeddings dequantized from the file's table per call, in `dtype`."""

    def __init__(self, weights: StoredWeights, dtype: torch.dtype) -> None:
        self.weights, self.dtype = weights, dtype

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.weights.embedding_rows(input_ids).to(self.dtype)


class StoredLinearFactory:
    """`factory(w1, w2, ...)`: the layer of the parameters `w1, w2, ...` (stacked by rows), from the file."""

    quantize = "gguf"

    def __init__(self, weights: StoredWeights, model: TransformersModule, dtype: torch.dtype,
                 native: bool = True, float32_levels: int = 2) -> None:
        self.weights, self.dtype, self.native = weights, dtype, native
        self.float32_levels = float32_levels  # what each block product rounds float32 rows to
        self.names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
        self.as_stored: Counter[str] = Counter()
        self.dequantized: Counter[str] = Counter()

    def __call__(self, *parameters: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        names = [self.names[id(p)] for p in parameters]
        parts = [self.weights.block_codes(name) for name in names]
        kind = "+".join(dict.fromkeys(self.weights.type_name(name) for name in names))
        stored = [part for part in parts if part is not None]
        if len(stored) == len(parts):
            self.as_stored[kind] += 1
            layer = BlockLinear.load_stacked(stored) if self.native else None
            if layer is None:
                return torch_block_linear(BlockCodes.concat(stored), self.dtype)
            layer.float32_levels = self.float32_levels
            return layer
        if not self.dequantized[kind]:
            logger.info("GGUF tensors of type %s have no block product here: dequantized to %s (%s, ...)",
                        kind, str(self.dtype).removeprefix("torch."), names[0])
        self.dequantized[kind] += 1
        return PackedLinear(torch.cat([self.weights.float(name) for name in names]).to(self.dtype))

    def embedding(self) -> QuantizedEmbedding:
        return QuantizedEmbedding(self.weights, self.dtype)

    def describe(self) -> str:
        stored = ", ".join(f"{count} {kind}" for kind, count in self.as_stored.items())
        dequantized = ", ".join(f"{count} {kind}" for kind, count in self.dequantized.items())
        return (f"GGUF blocks as stored ({stored or 'none'})"
                + (f"; dequantized: {dequantized}" if dequantized else ""))
