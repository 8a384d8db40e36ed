"""A linear product with the step's adapters added to it, and the per-step state it reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ztgi.services.worker.lora.stacked_adapters import StackedSite

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class LoraStep:
    """What this step's products add: per product its stacked adapters and its `[rows, W]` mask of
    each row's own adapter columns. Empty when no row of the step uses an adapter."""

    sites: dict[str, StackedSite] = dataclasses.field(default_factory=dict)
    masks: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.masks)


class LoraLinear:
    """`base(x)`, plus each row's adapter product when the step has adapters (`LoraStep`)."""

    def __init__(self, base: Linear, step: LoraStep, site: str, layer: int) -> None:
        self.base = base
        self.step = step
        self.site = site
        self.layer = layer

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        mask = self.step.masks.get(self.site)
        if mask is None:
            return y
        stacked = self.step.sites[self.site]
        low_rank = F.linear(x, stacked.a[self.layer]).mul_(mask)
        return torch.addmm(y, low_rank, stacked.b[self.layer])
