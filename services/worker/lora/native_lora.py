"""The adapters' products in one C call per product and step (`kernels/csrc/lora.c`), for bfloat16 on
CPU: each row does only its own adapter's work, where the masked product (`lora_linear.py`) does every
adapter's for every row in several small torch ops, whose fixed costs dominate a decode step."""

from __future__ import annotations

import ctypes

import torch

from ztgi.services.worker.kernels import native_library
from ztgi.services.worker.kernels.native_library import INT, INT64, POINTER
from ztgi.services.worker.lora.site_layout import SiteLayout


class NativeLora:
    """`add` runs a product's adapters for the step's rows into its output, in place."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._add = native_library.bind(library, "lora_add_bf16", [
            POINTER, INT64, INT, POINTER, INT, POINTER, POINTER, POINTER, POINTER, POINTER, INT, POINTER, INT64, INT])

    @classmethod
    def load(cls, layouts: list[SiteLayout], dtype: torch.dtype, device: torch.device) -> NativeLora | None:
        """The C products for these layouts where they build and take these shapes; else None."""
        if dtype is not torch.bfloat16 or device.type != "cpu":
            return None
        if any(layout.in_features % 32 or any(width % 16 for width in layout.widths) for layout in layouts):
            return None
        library = native_library.load_or_none("lora.c", "LoRA products")
        return cls(library) if library is not None else None

    def add(self, x: torch.Tensor, y: torch.Tensor, row_slots: torch.Tensor, tables: LayerTables,
            layout: LayoutTables) -> None:
        status = self._add(x.data_ptr(), x.shape[0], x.shape[1], row_slots.data_ptr(), tables.num_slots,
                           tables.a.data_ptr(), tables.bt.data_ptr(), tables.ranks.data_ptr(),
                           layout.offsets.data_ptr(), layout.widths.data_ptr(), layout.num_modules, y.data_ptr(),
                           y.stride(0), torch.get_num_threads())
        if status != 0:
            raise ValueError(f"lora_add_bf16 refused its inputs (status {status})")


class LayoutTables:
    """A product's modules' output offsets and widths, as the C code reads them."""

    def __init__(self, layout: SiteLayout) -> None:
        self.num_modules = len(layout.modules)
        self.offsets = torch.tensor(layout.offsets, dtype=torch.int32)
        self.widths = torch.tensor(layout.widths, dtype=torch.int32)


class LayerTables:
    """One layer's product over the stacked adapters: per (slot, module) the addresses of A and
    Bt (`AdapterWeights`' own tensors) and the rank (0 where the adapter leaves the module alone);
    holds the tensors it points to."""

    def __init__(self, pairs: list[list[tuple[torch.Tensor, torch.Tensor] | None]]) -> None:
        self.num_slots = len(pairs)
        flat = [pair for modules in pairs for pair in modules]  # (A, Bt), both contiguous
        self._tensors = flat  # what the addresses point to, alive as long as the tables
        self.a = torch.tensor([t[0].data_ptr() if t else 0 for t in flat], dtype=torch.int64)
        self.bt = torch.tensor([t[1].data_ptr() if t else 0 for t in flat], dtype=torch.int64)
        self.ranks = torch.tensor([t[0].shape[0] if t else 0 for t in flat], dtype=torch.int32)
