"""A linear product with the step's adapters added to it, and the per-step state it reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ztgi.services.worker.lora.native_lora import NativeLora
from ztgi.services.worker.lora.stacked_adapters import StackedSite

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class LoraStep:
    """What this step's products add: per product its stacked adapters, each row's slot (its
    adapter's place in the stack, 0 for the base model) and, for the masked product, the `[rows, W]`
    mask of each row's own adapter columns. `row_slots` is None when no row uses an adapter."""

    sites: dict[str, StackedSite] = dataclasses.field(default_factory=dict)
    masks: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    row_slots: torch.Tensor | None = None  # [rows] int32
    native: NativeLora | None = None  # the C products, where they run (bfloat16 on CPU)

    @property
    def active(self) -> bool:
        return self.row_slots is not None


class LoraLinear:
    """`base(x)`, plus each row's adapter product when the step has adapters (`LoraStep`)."""

    def __init__(self, base: Linear, step: LoraStep, site: str, layer: int) -> None:
        self.base = base
        self.step = step
        self.site = site
        self.layer = layer

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.step
        if step.row_slots is None:
            return y
        stacked = step.sites.get(self.site)
        if stacked is None:
            return y
        if step.native is not None:
            assert stacked.layout is not None, "stacked for the C products"
            step.native.add(x.contiguous(), y, step.row_slots, stacked.tables[self.layer], stacked.layout)
            return y
        low_rank = F.linear(x, stacked.a[self.layer]).mul_(step.masks[self.site])
        return torch.addmm(y, low_rank, stacked.b[self.layer])
