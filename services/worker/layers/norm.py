"""RMSNorm as the families write it: Llama's `w * x` and Gemma's `(1 + w) * x` computed in float32; and
`rms_norm`, Llama's rounded as transformers rounds it, for the Llama forwards."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.transformers_module import TransformersModule


class RMSNorm:
    """`x / rms(x)` times the weight; `offset` for Gemma, whose stored weight is `w - 1`."""

    def __init__(self, module: TransformersModule, offset: bool = False) -> None:
        weight = module.weight.detach()
        self.eps = float(getattr(module, "variance_epsilon", None) or module.eps)
        self.offset = offset
        self.weight = (1.0 + weight.float()) if offset else weight.clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.offset:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Gemma multiplies before casting back (transformers' Gemma RMSNorm), so float32 throughout
        return (F.rms_norm(x.float(), (x.shape[-1],), None, self.eps) * self.weight).type_as(x)



def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm rounded as transformers' `LlamaRMSNorm` rounds it (normalized in float32, cast, then
    scaled), so bfloat16 greedy texts equal transformers' in bfloat16; in float32 it is `F.rms_norm`."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
