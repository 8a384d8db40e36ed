"""The adapters one step mixes, stacked per product and layer so that any mix of them (and the
base model) costs three tensor ops a product, whatever the number of adapters.

For a product of input width `in` and output width `out`, the adapters' `A` rows are stacked into
one `[W, in]` and their scaled `B` columns into one `[W, out]` (each module's block at its place
in the product's output), `W` the sum of their ranks. A step computes `t = x A^T` for every row,
zeroes in each row the columns of adapters other than its own (a `[rows, W]` mask, made once per
step), and adds `t B`: each row gets exactly its adapter's low-rank product, base rows nothing (the
gathered products of Punica and S-LoRA, done as one masked product on the CPU). A layer an adapter
does not adapt has zeros in its columns.
"""

from __future__ import annotations

import dataclasses

import torch

from ztgi.services.worker.lora.adapter_weights import AdapterWeights
from ztgi.services.worker.lora.native_lora import LayerTables, LayoutTables
from ztgi.services.worker.lora.site_layout import SiteLayout


@dataclasses.dataclass(frozen=True)
class StackedSite:
    """One product's stacked weights, per layer, and the slot (1-based adapter index) of each
    column; for the C products (`native_lora.py`) instead, per layer the tables of each slot's own."""

    a: list[torch.Tensor] = dataclasses.field(default_factory=list)  # per layer [W, in]
    b: list[torch.Tensor] = dataclasses.field(default_factory=list)  # per layer [W, out]
    column_slots: torch.Tensor | None = None  # [W] int64
    tables: list[LayerTables] = dataclasses.field(default_factory=list)  # per layer, for the C products
    layout: LayoutTables | None = None


def stack(adapters: list[AdapterWeights], layouts: list[SiteLayout], num_layers: int, dtype: torch.dtype,
          device: torch.device, native: bool = False) -> dict[str, StackedSite]:
    """Each product's stack over `adapters` (slot i + 1 is adapters[i]), as the masked product
    reads it or (`native`) as the C products do; products none of them adapts are left out."""
    sites = {}
    for layout in layouts:
        columns = [(slot, index, adapter.rank_of(module))
                   for slot, adapter in enumerate(adapters, 1)
                   for index, module in enumerate(layout.modules) if adapter.rank_of(module)]
        if not columns:
            continue
        if native:
            tables = [LayerTables([[adapter.tensors.get((layer, module)) for module in layout.modules]
                                   for adapter in adapters]) for layer in range(num_layers)]
            sites[layout.name] = StackedSite(tables=tables, layout=LayoutTables(layout))
        else:
            sites[layout.name] = _stack_site(adapters, layout, columns, num_layers, dtype, device)
    return sites


def _stack_site(adapters: list[AdapterWeights], layout: SiteLayout, columns: list[tuple[int, int, int]],
                num_layers: int, dtype: torch.dtype, device: torch.device) -> StackedSite:
    width = sum(rank for _, _, rank in columns)
    a_layers, b_layers = [], []
    for layer in range(num_layers):
        a = torch.zeros(width, layout.in_features, dtype=dtype)
        b = torch.zeros(width, layout.out_features, dtype=dtype)
        first = 0
        for slot, index, rank in columns:
            pair = adapters[slot - 1].tensors.get((layer, layout.modules[index]))
            if pair is not None:
                lora_a, lora_bt = pair
                start = layout.offsets[index]
                a[first:first + lora_a.shape[0]] = lora_a
                b[first:first + lora_a.shape[0], start:start + layout.widths[index]] = lora_bt
            first += rank
        a_layers.append(a.to(device))
        b_layers.append(b.to(device))
    slots = torch.tensor([slot for slot, _, rank in columns for _ in range(rank)], dtype=torch.int64, device=device)
    return StackedSite(a_layers, b_layers, slots)
