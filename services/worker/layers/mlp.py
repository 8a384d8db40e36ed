"""The gated MLP every family here uses: `down(act(gate(x)) * up(x))`, gate and up in one product."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ztgi.services.worker.layers.packed_linear import PackedLinear
from ztgi.services.worker.layers.transformers_module import TransformersModule

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class GatedMLP:
    """Fused gate/up projection (Phi-3 stores it fused, `gate_up_proj`, gate first), activation, down."""

    def __init__(self, mlp: TransformersModule, activation: str | None) -> None:
        if activation is None or activation not in ACTIVATIONS:
            raise TypeError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]
        fused = getattr(mlp, "gate_up_proj", None)
        weight = fused.weight if fused is not None else torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.intermediate_size = weight.shape[0] // 2
        self.gate_up: Callable[[torch.Tensor], torch.Tensor] = PackedLinear(weight)
        self.down: Callable[[torch.Tensor], torch.Tensor] = PackedLinear(mlp.down_proj.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate_size, dim=-1)
        return self.down(self.activation(gate) * up)
