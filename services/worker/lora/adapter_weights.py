"""An adapter's tensors, loaded for the worker's model: per adapted linear, `A` and `B` with PEFT's
scale folded into `B`, `B` transposed (`[rank, out]`: what both products read), in the model's dtype."""

from __future__ import annotations

import dataclasses
import os

import torch

from ztgi.common.lora_adapter import WEIGHTS_FILE, AdapterError, AdapterSpec


@dataclasses.dataclass(frozen=True)
class AdapterWeights:
    """(layer, module) -> (A `[rank, in]`, (scale * B)^T `[rank, out]`)."""

    spec: AdapterSpec
    tensors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    def rank_of(self, module: str) -> int:
        """The module's rank (the largest over layers; 0 where it is not adapted)."""
        return max((m.rank for (_, name), m in self.spec.modules.items() if name == module), default=0)


def load_adapter_weights(spec: AdapterSpec, dtype: torch.dtype) -> AdapterWeights:
    """The tensors `spec` names, read from its safetensors file; AdapterError when the file changed
    since it was checked (a tensor missing or of another shape)."""
    from safetensors import SafetensorError, safe_open

    path = os.path.join(spec.path, WEIGHTS_FILE)
    tensors = {}
    try:
        with safe_open(path, framework="pt") as file:
            for key, (a_name, b_name) in spec.tensor_names.items():
                module = spec.modules[key]
                a, b = file.get_tensor(a_name), file.get_tensor(b_name)
                if tuple(a.shape) != (module.rank, module.in_features) or \
                        tuple(b.shape) != (module.out_features, module.rank):
                    raise AdapterError(f"{path} changed since it was loaded: {a_name} is {list(a.shape)}")
                scaled_b = (b.double() * module.scale).to(dtype) if module.scale != 1.0 else b.to(dtype)
                tensors[key] = (a.to(dtype).contiguous(), scaled_b.T.contiguous())
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{path} cannot be read: {exc}") from None
    return AdapterWeights(spec, tensors)
